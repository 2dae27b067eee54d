"""The GPU suite's trainer-rank kill (tests/gpu/test_trainer_kill.py) as its CPU dry run, so that the kill, the resume
and the comparison run where the suite is skipped: a rank of the trainer's own code (`tests.support.gpu_trainer_child`:
its group over gloo, FSDP2, AdamW, `train_step`, the checkpoint writer and loader) SIGKILLed in the middle of step 3's
backward after committing step 2, and a fresh rank that loads that checkpoint trains step 3 as a rank that was never
killed, bitwise (the CPU's kernels repeat; the GPU run is held to a tolerance)."""

import pytest

from tests.gpu.test_trainer_kill import CHECKPOINT_AFTER, STEPS, kill_mid_step, resume_and_compare

pytestmark = pytest.mark.processes  # three trainer ranks, one after the other, each a process of its own


def test_a_cpu_rank_killed_mid_step_resumes_bitwise_from_its_checkpoint(tmp_path):
    killed = kill_mid_step("cpu", tmp_path)
    assert killed.stalled["step"] == STEPS and killed.stalled["device"] == "cpu"
    assert sorted(map(int, killed.stalled["steps"])) == list(range(1, STEPS))  # the steps before the kill
    assert [path.name for path in (killed.run_dir / "checkpoints").iterdir()] == [f"step_{CHECKPOINT_AFTER:08d}"]
    comparison = resume_and_compare("cpu", killed, tmp_path)
    assert comparison.bitwise, comparison
