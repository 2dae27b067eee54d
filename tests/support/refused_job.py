"""A monarch job whose scheduler refuses it, as `SlurmJob` reports sbatch's refusal (real Slurm 22.05 message)."""


class RefusedJob:
    active = True

    def __init__(self):
        self.killed = 0

    def state(self, cached_path=None):
        raise RuntimeError(
            "Failed to submit SLURM job: sbatch: error: Memory specification can not be satisfied\n"
            "sbatch: error: Batch job submission failed: Requested node configuration is not available"
        )

    def kill(self):
        self.killed += 1
