"""Where the roles run: one host, local processes, Slurm or Kubernetes, and how many hosts each role gets."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rl.section import Section


class SlurmOptions(Section):
    """`monarch.job.SlurmJob` settings; one sbatch allocation holds every role's hosts."""

    partition: str | None = None
    time: str | None = None
    """Time limit "HH:MM:SS"; None = the partition's default."""
    account: str | None = None
    qos: str | None = None
    gpus_per_node: int | None = Field(None, ge=1)
    cpus_per_task: int | None = Field(None, ge=1)
    mem: str | None = None
    python_exe: str = "python"
    """The Python on the nodes that has rlmesh's environment (e.g. /shared/rlmesh/.venv/bin/python)."""
    job_name: str = "rlmesh"
    log_dir: str | None = None
    slurm_args: list[str] = Field(default_factory=list)
    """Extra sbatch arguments, e.g. ["--constraint=h100"]."""
    job_start_timeout: int | None = Field(None, ge=1)
    """Seconds to wait in the queue before giving up; None = wait."""


class KubernetesOptions(Section):
    """`monarch.job.KubernetesJob` settings: one MonarchMesh (pods) per role, provisioned by the MonarchMesh operator."""

    namespace: str = "default"
    image: str
    """Container image with rlmesh's environment installed."""
    gpus_per_pod: int = Field(0, ge=0)
    shared_memory_size: str | None = None
    """/dev/shm size for NCCL, e.g. "64Gi"."""
    timeout: int | None = Field(None, ge=1)
    """Seconds to wait for the pods to be ready; None = wait."""


class ClusterHosts(Section):
    """Hosts allocated per role; 0 = the role runs on the launcher's host."""

    trainer: int = Field(0, ge=0)
    generator: int = Field(0, ge=0)
    reward: int = Field(0, ge=0)
    models: int = Field(0, ge=0)
    """Hosts of the frozen models (`[models.<name>]`): every model's replicas go round-robin over them."""

    def allocated(self) -> dict[str, int]:
        """Roles that get hosts of their own, with how many."""
        return {role: count for role, count in self.model_dump().items() if count > 0}


class ClusterConfig(Section):
    """Where the roles run. `local`: all on this host. Otherwise `hosts` are allocated per role from the scheduler."""

    scheduler: Literal["local", "process", "slurm", "kubernetes"] = "local"
    hosts: ClusterHosts = ClusterHosts()
    """Hosts per role, e.g. { trainer = 1, generator = 1 }; a role left out runs on the launcher's host."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment of every process on an allocated host (they do not inherit the launcher's), e.g. HF_HOME."""
    slurm: SlurmOptions = SlurmOptions()
    kubernetes: KubernetesOptions | None = None
