"""Where the roles run: one host, local processes, workers already running, Slurm or Kubernetes, and how many hosts each
role gets."""

from __future__ import annotations

import datetime
from typing import Literal

from pydantic import Field, field_validator

from rl.config.section import Section


class SlurmOptions(Section):
    """`monarch.job.SlurmJob` settings; one sbatch allocation holds every role's hosts."""

    partition: str | None = None
    """sbatch `--partition`; None = the cluster's default."""
    time: str | None = None
    """Time limit "HH:MM:SS" (or any sbatch `--time`, e.g. "2-00:00:00"); None = the partition's default."""
    account: str | None = None
    """sbatch `--account`."""
    qos: str | None = None
    """sbatch `--qos`."""
    gpus_per_node: int | None = Field(None, ge=1)
    """GPUs requested per node."""
    cpus_per_task: int | None = Field(None, ge=1)
    """sbatch `--cpus-per-task`."""
    mem: str | None = None
    """Memory per node, e.g. "200G"."""
    python_exe: str = "python"
    """The Python on the nodes that has rlmesh's environment (e.g. /shared/rlmesh/.venv/bin/python)."""
    job_name: str = "rlmesh"
    """sbatch `--job-name`."""
    log_dir: str | None = None
    """Where the job's stdout and stderr go; None = monarch's default."""
    slurm_args: list[str] = Field(default_factory=list)
    """Extra sbatch arguments, e.g. ["--constraint=h100"]."""
    job_start_timeout: int | None = Field(None, ge=1)
    """Seconds to wait in the queue before giving up; None = wait."""

    @field_validator("time", mode="before")
    @classmethod
    def _time_of_day_as_limit(cls, value: object) -> object:
        """`time = 04:00:00` unquoted (or `--cluster.slurm.time 04:00:00`) is a TOML time of day: read it as "04:00:00"."""
        return value.isoformat() if isinstance(value, datetime.time) else value


class KubernetesOptions(Section):
    """`monarch.job.KubernetesJob` settings: one MonarchMesh (pods) per role, provisioned by the MonarchMesh operator."""

    namespace: str = "default"
    """Namespace of the MonarchMesh resources."""
    image: str
    """Container image with rlmesh's environment installed."""
    gpus_per_pod: int = Field(0, ge=0)
    """`nvidia.com/gpu` requested per pod; 0 = none."""
    shared_memory_size: str | None = None
    """/dev/shm size for NCCL, e.g. "64Gi"."""
    timeout: int | None = Field(None, ge=1)
    """Seconds to wait for the pods to be ready; None = wait."""


class ClusterHosts(Section):
    """Hosts allocated per role; 0 = the role runs on the launcher's host."""

    trainer: int = Field(0, ge=0)
    """Hosts of the trainer's ranks (`trainer.num_procs` per host); must agree with `trainer.num_hosts`."""
    generator: int = Field(0, ge=0)
    """Hosts of the policy generators; `generator.num_replicas` must be a multiple of it."""
    reward: int = Field(0, ge=0)
    """Hosts of the reward actors."""
    models: int = Field(0, ge=0)
    """Hosts of the frozen models (`[models.<name>]`): every model's replicas go round-robin over them."""

    def allocated(self) -> dict[str, int]:
        """Roles that get hosts of their own, with how many."""
        return {role: count for role, count in self.model_dump().items() if count > 0}


class ClusterConfig(Section):
    """Where the roles run. `local`: all on this host. Otherwise `hosts` are allocated per role from the scheduler."""

    scheduler: Literal["local", "process", "attach", "slurm", "kubernetes"] = "local"
    """"local": everything on this host; "process": simulated hosts as local processes; "attach": hosts whose workers
    already run (`rlmesh worker`, addresses in `workers`); "slurm", "kubernetes": hosts allocated through `monarch.job`."""
    hosts: ClusterHosts = ClusterHosts()
    """Hosts per role, e.g. { trainer = 1, generator = 1 }; a role left out runs on the launcher's host."""
    workers: dict[str, list[str]] = Field(default_factory=dict)
    """With `scheduler = "attach"`: per role, the address of each host's worker, started there with
    `rlmesh worker --address tcp://0.0.0.0:PORT`, e.g. { generator = ["tcp://gpu-node-3:26600"] }; as many as
    `hosts` gives the role."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment of every process on an allocated host, e.g. HF_HOME, on top of its worker's: the launcher's with
    "process" and on Slurm (sbatch passes it, `--export=ALL` by default), the worker's own with "attach", the image's on
    Kubernetes."""
    slurm: SlurmOptions = SlurmOptions()
    """Used when `scheduler = "slurm"`."""
    kubernetes: KubernetesOptions | None = None
    """Required when `scheduler = "kubernetes"`."""
