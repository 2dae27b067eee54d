"""Where each role's processes run: the hosts a run allocates (`[cluster]`) and how a role's procs start on them.

    local       every role on the launcher's host (`this_host()`), nothing allocated
    process     each role's hosts are local worker processes (monarch `ProcessJob`): multi-host on one machine
    attach      each role's hosts are workers already running at `cluster.workers` (rl/processes/attach.py), over TCP
    slurm       `SlurmJob` (rl/processes/slurm.py reads older Slurm's squeue): one sbatch allocation, a host mesh per role
    kubernetes  `KubernetesJob`: a MonarchMesh of pods per role (the MonarchMesh operator provisions them)

A role not listed in `cluster.hosts` runs on the launcher's host. Processes on allocated hosts inherit their
worker's environment (on Slurm and "process" the launcher's, on Kubernetes the image's); `cluster.env` (and, on GPU,
each process's `CUDA_VISIBLE_DEVICES`) goes on top of it through the bootstrap command. `Placement.release()` frees
the allocation; the controller calls it on every exit path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from monarch.actor import HostMesh, default_bootstrap_cmd, this_host

from rl.config.cluster import ClusterConfig
from rl.config.roles import FrozenModelConfig, GeneratorConfig, TrainerConfig
from rl.processes import bootstrap as bootstrap_entry


def bootstrap_command(env: dict[str, str], device: str, first_gpu: int, gpus_per_proc: int) -> Callable[[Any], Any]:
    """Per-process bootstrap: monarch's, entered through `rl.processes.bootstrap` (an exit without the interpreter's
    last collection), with `env`, plus on GPU the `gpus_per_proc` GPUs of the process's slot on its host.

    The slot is the process's index on its host (the `procs` coordinate), so every host numbers its GPUs from
    `first_gpu`.
    """

    def command(point: Any) -> Any:
        variables = dict(env)
        if device == "cuda" and gpus_per_proc > 0:
            start = first_gpu + point["procs"] * gpus_per_proc
            variables["CUDA_VISIBLE_DEVICES"] = ",".join(str(gpu) for gpu in range(start, start + gpus_per_proc))
        bootstrap = default_bootstrap_cmd().with_env(variables)
        bootstrap.args = ["-m", bootstrap_entry.ENTRY]
        return bootstrap

    return command


class HostsNotAllocated(RuntimeError):
    """The scheduler did not give the run its hosts (sbatch refused the job, it did not start within
    `job_start_timeout`, ...): the message is the scheduler's reason; nothing stays allocated."""


def make_job(cluster: ClusterConfig) -> Any:
    """The monarch job for `cluster` (not yet applied), one host mesh per role in `cluster.hosts`."""
    meshes = cluster.hosts.allocated()
    if cluster.scheduler == "process":
        from monarch.job import ProcessJob

        return ProcessJob(meshes, env=cluster.env or None)
    if cluster.scheduler == "attach":
        from rl.processes.attach import AttachedWorkers

        return AttachedWorkers(cluster.workers)
    if cluster.scheduler == "slurm":
        from rl.processes.slurm import RlmeshSlurmJob

        slurm = cluster.slurm
        return RlmeshSlurmJob(
            meshes,
            python_exe=slurm.python_exe,
            slurm_args=slurm.slurm_args,
            job_name=slurm.job_name,
            time_limit=slurm.time,
            partition=slurm.partition,
            log_dir=slurm.log_dir,
            gpus_per_node=slurm.gpus_per_node,
            cpus_per_task=slurm.cpus_per_task,
            mem=slurm.mem,
            account=slurm.account,
            qos=slurm.qos,
            job_start_timeout=slurm.job_start_timeout,
        )
    if cluster.scheduler == "kubernetes":
        from monarch.job.kubernetes import ImageSpec, KubernetesJob  # needs the `kubernetes` package

        k8s = cluster.kubernetes
        job = KubernetesJob(namespace=k8s.namespace, timeout=k8s.timeout)
        resources = {"nvidia.com/gpu": k8s.gpus_per_pod} if k8s.gpus_per_pod else None
        for role, count in meshes.items():
            job.add_mesh(
                role,
                count,
                image_spec=ImageSpec(k8s.image, resources=resources, shared_memory_size=k8s.shared_memory_size),
            )
        return job
    raise ValueError(f"scheduler {cluster.scheduler!r} allocates nothing")


class Placement:
    """The hosts of each role for one run; `spawn_procs` starts a role's processes on them.

    The job is built here, before anything starts monarch's client: building a Slurm or Kubernetes job
    switches this process's transport to TCP, which the root client must be created with.
    """

    def __init__(
        self,
        cluster: ClusterConfig,
        trainer: TrainerConfig,
        generator: GeneratorConfig,
        models: dict[str, FrozenModelConfig],
        with_trainer: bool = True,
    ):
        """The roles' sections say how many processes and GPUs each takes: on the launcher's host the trainer's
        `num_procs` take the first GPUs, the generator replicas the next, the frozen models (`[models.<name>]`) the rest.
        `with_trainer=False` (`rlmesh eval`): the trainer takes no host and no GPU."""
        if not with_trainer:
            cluster = cluster.model_copy(update={"hosts": cluster.hosts.model_copy(update={"trainer": 0})})
        self.cluster = cluster
        self.with_trainer = with_trainer
        self.trainer = trainer
        self.generator = generator
        self.models = models
        self.job: Any = make_job(cluster) if cluster.scheduler != "local" and cluster.hosts.allocated() else None
        self.hosts: dict[str, HostMesh] = {}

    def allocate(self) -> Placement:
        """Check the launcher's host has the GPUs its roles need, then allocate the hosts (blocks until the scheduler
        grants them; a no-op for `local`). Raises `HostsNotAllocated` with the scheduler's reason when it does not."""
        if self.local_gpus_needed():
            from rl.gpus import local_gpus

            self.check_local_gpus(local_gpus().count)
        if self.job is not None and not self.hosts:
            try:
                state = self.job.state(cached_path=None)
                self.hosts = {role: getattr(state, role) for role in self.cluster.hosts.allocated()}
            except (RuntimeError, TimeoutError) as error:  # how monarch.job reports a scheduler's refusal or timeout
                self.release()
                raise HostsNotAllocated(f"{self.cluster.scheduler}: {error}") from error
            except BaseException:
                self.release()
                raise
        return self

    def host_mesh(self, role: str) -> HostMesh:
        return self.hosts.get(role) or this_host()

    def spawn_procs(
        self, role: str, per_host: dict[str, int], gpus_per_proc: int = 0, first_gpu: int | None = None
    ) -> Any:
        """`per_host` processes on each of `role`'s hosts, each with its environment and its GPUs.

        `first_gpu` defaults to 0 on a role's own hosts; on the launcher's host the trainer takes the first
        `trainer.num_procs` GPUs and other roles follow it.
        """
        if first_gpu is None:
            first_gpu = 0 if role in self.hosts or role == "trainer" else self._first_local_gpu(role)
        env = self.cluster.env if role in self.hosts else {}
        device = self.trainer.device
        return self.host_mesh(role).spawn_procs(
            per_host=per_host, bootstrap_command=bootstrap_command(env, device, first_gpu, gpus_per_proc)
        )

    def replica_procs(
        self, role: str, gpus_per_proc: int = 0, offset: int = 0, device: str | None = None
    ) -> Callable[[int], Any]:
        """Replica index -> a one-process proc mesh for it: replicas go round-robin over `role`'s hosts,
        and on each host take consecutive GPU slots (what `rl.services` spawns and respawns replicas with).

        `offset`: replicas of the role spawned before these (another frozen model's), whose slots these follow;
        `device`: the replicas' device (default `trainer.device`)."""

        def spawn(index: int) -> Any:
            slot = offset + index
            host = self.host_mesh(role)
            num_hosts = host.sizes.get("hosts", 1)
            if num_hosts > 1:
                host = host.slice(hosts=slot % num_hosts)
            first_gpu = 0 if role in self.hosts else self._first_local_gpu(role)
            env = self.cluster.env if role in self.hosts else {}
            command = bootstrap_command(
                env, device or self.trainer.device, first_gpu + (slot // num_hosts) * gpus_per_proc, gpus_per_proc
            )
            return host.spawn_procs(per_host={"procs": 1}, bootstrap_command=command)

        return spawn

    def frozen_procs(self, name: str) -> Callable[[int], Any]:
        """Replica index -> a proc mesh for frozen model `name`'s replica: on the `models` hosts of `[cluster]` (round-robin,
        after the replicas of the models declared before it), else on the launcher's host after the generators' GPUs."""
        models = list(self.models)
        offset = sum(self.models[other].replicas for other in models[: models.index(name)])
        model = self.models[name]
        gpus = self.generator.tensor_parallel_size if model.device == "cuda" else 0
        return self.replica_procs("models", gpus_per_proc=gpus, offset=offset, device=model.device)

    def _first_local_gpu(self, role: str) -> int:
        """On the launcher's host the trainer takes the first GPUs, the generator replicas the next (or the trainer's own
        with `generator.colocate_with_trainer`), frozen models the rest."""
        if role == "generator" and self.generator.colocate_with_trainer:
            return 0
        first = self.trainer.num_procs if self.with_trainer else 0
        if role == "models" and self._generator_gpus_after_trainer():
            first += self.generator.num_replicas * self.generator.tensor_parallel_size
        return first

    def _generator_gpus_after_trainer(self) -> bool:
        allocated = self.cluster.hosts.allocated()
        return (
            "generator" not in allocated
            and self.generator.device == "cuda"
            and not self.generator.colocate_with_trainer
        )

    def local_gpus_needed(self) -> dict[str, int]:
        """GPU slots each role takes on the launcher's host, by role (GPU index after its last slot; empty on CPU)."""
        allocated = self.cluster.hosts.allocated()
        if self.trainer.device != "cuda":
            return {}
        tp = self.generator.tensor_parallel_size
        needed: dict[str, int] = {}
        if "trainer" not in allocated and self.with_trainer:
            needed["trainer"] = self.trainer.num_procs
        if "generator" not in allocated:
            needed["generator"] = self._first_local_gpu("generator") + self.generator.num_replicas * tp
        cuda_models = sum(model.replicas for model in self.models.values() if model.device == "cuda")
        if "models" not in allocated and cuda_models:
            needed["models"] = self._first_local_gpu("models") + cuda_models * tp
        return needed

    def check_local_gpus(self, present: int) -> None:
        """Refuse to start when the roles on the launcher's host need more GPUs than it has, naming the counts."""
        needed = self.local_gpus_needed()
        if needed and max(needed.values()) > present:
            slots = ", ".join(f"{role} up to GPU {end - 1}" for role, end in needed.items())
            raise ValueError(
                f"the roles on this host need {max(needed.values())} GPU(s) ({slots}), but {present} are present; "
                "on one GPU set generator.colocate_with_trainer = true (with trainer.gpu_memory_fraction), or give "
                "roles hosts of their own in [cluster]"
            )

    def release(self) -> None:
        """Free every allocated host (their processes with them); safe to call twice."""
        self.hosts = {}
        if self.job is not None and self.job.active:
            self.job.kill()
