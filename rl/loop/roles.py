"""The run's roles and their processes: where they run, how they start, how a failure is told apart, how they stop.

    start:  run log, weight store → hosts (`[cluster]`) → trainer mesh ‖ generator service ‖ reward service ‖ frozen models
    fault:  Monarch's hook → a replica's report goes to its service (it replaces the replica);
            any other stops the run through the controller's `stop_run(message)`
    stop:   release weights and engines → stop every mesh → reap what is left → free the hosts → stop the store

Frozen models (`[models.<name>]`) are teachers and samplers served by their own, never-updated
Generators: they give token sequences their logprobs (vLLM's prompt-logprob path; "policy" goes to
the live generators, for opsd) and sample the rows of tasks whose `sampler` names them. They must
share the policy's tokenizer: sequences are passed as token ids.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import monarch.actor
import monarch.config

from actors.generator import Generator, WeightUpdate
from actors.reward import RewardActor
from actors.trainer import PolicyTrainer
from rl.checkpoint import store as checkpoint
from rl.config import Config
from rl.config.algorithm import POLICY
from rl.config.roles import FrozenModelConfig, GeneratorConfig, SamplingConfig
from rl.console import say, warn
from rl.metrics.actor import gather_states
from rl.metrics.memory import peak_states, reset_peaks
from rl.metrics.run_log import RunLog
from rl.metrics.timer import timer
from rl.processes.cluster import Placement
from rl.processes.interrupts import local_processes, monarch_processes, reap
from rl.processes.trainer_mesh import RENDEZVOUS_SUFFIX, spawn_trainer
from rl.services.gateway import Gateway, open_gateway
from rl.services.service import Service, after_run_fault_hook
from rl.weights import sync as weight_sync
from rl.weights.attestation import Fingerprints
from rollouts.types import Completion, GenerationFailed, GenerationRequest, RolloutGroup, RolloutStatus

RESUME_HINT = "resume from the last checkpoint with `rlmesh train --resume RUN_DIR`"


MEMORY_TIMEOUT_S = 5.0
"""How long a step waits for a process's peak memory (read from /proc, answered at once by a live process): a hung
replica delays no step by more, and its peak is left out of the step."""


class NonFiniteWeights(RuntimeError):
    """The trainer's weights hold an inf or NaN: the version is not sent to any generator and the run stops."""


class AdapterNotServed(RuntimeError):
    """After a LoRA sync a generator's logprobs differ from the trainer's: the adapter did not reach it or is not applied."""


SYNC_PROBE = list(range(100, 164))
"""Token ids whose logprobs the trainer and every generator compare after an adapter sync (any vocabulary has them)."""


class DeadlineMissed(RuntimeError):
    """A trainer call or the end-of-step metric gathering missed its deadline: the run stops, as on the trainer's death."""


async def within(call: Awaitable[Any], what: str, key: str, timeout_s: float) -> Any:
    """Await an actor call within `timeout_s` (config key `key`); DeadlineMissed, naming both, instead of hanging."""
    try:
        return await asyncio.wait_for(call, timeout_s)
    except TimeoutError:
        raise DeadlineMissed(f"{what} took longer than {key}={timeout_s} s; {RESUME_HINT}") from None


def refusal(update: WeightUpdate) -> str | None:
    """Why a generator's weight update must not take traffic (its attestation failed), or None."""
    if update.verdict is not None and not update.verdict.attested:
        return update.verdict.summary()
    return None


def full_refusal(update: WeightUpdate) -> str | None:
    """`refusal`, and a replica that cannot load even a full version (its copy of it failed its digest)."""
    if (reason := refusal(update)) is not None:
        return reason
    return f"cannot load the full version: {update.needs_full}" if update.needs_full else None


def frozen_generator(generator: GeneratorConfig, model: FrozenModelConfig) -> GeneratorConfig:
    """A frozen model's Generator section: the policy's engine settings with the model's dtype, device and replicas."""
    return generator.model_copy(update={"dtype": model.dtype, "device": model.device, "num_replicas": model.replicas})


def starting_line(config: Config, trainer: bool = True) -> str:
    """The console line as the actors start (the slow part of a launch: vLLM engines, the trainer's model load)."""
    parts = [f"the trainer ({config.trainer.ranks} process(es): loading {config.model.path})"] if trainer else []
    parts.append(f"{config.generator.num_replicas} vLLM generator(s) ({config.model.path}, {config.generator.device})")
    parts.append(f"{config.services.reward.replicas} reward replica(s)")
    parts += [f"frozen model {name} ({model.replicas} vLLM)" for name, model in config.models.items()]
    return f"starting {', '.join(parts)}"


def hosts_line(trainer_ranks: list[str], services: dict[str, list[str]]) -> str:
    """The console line naming the host of every trainer rank (in rank order) and every replica of each service."""
    parts = [f"trainer ranks on {', '.join(trainer_ranks)}"] if trainer_ranks else []
    parts += [f"{name} on {', '.join(hosts)}" for name, hosts in services.items() if hosts]
    return f"on hosts: {'; '.join(parts)}"


class Roles:
    """The trainer, the generator and reward services and the frozen models' services of one run."""

    def __init__(
        self,
        config: Config,
        stop_run: Callable[[str], None],
        policy_version: Callable[[], int],
        with_trainer: bool = True,
    ):
        """`stop_run(message)`: stops the run (any thread); `policy_version()`: what a replacement generator loads;
        `with_trainer=False` (`rlmesh eval`): the generators serve `model.path` as it is, with no trainer (no host, no
        GPU, no process) and no weight store."""
        self.config = config
        self.stop_run = stop_run
        self.policy_version = policy_version
        self.with_trainer = with_trainer
        self.placement = Placement(config.cluster, config.trainer, config.generator, config.models, with_trainer)
        self.trainer: Any = None
        self.generators: Service | None = None
        self.reward: Service | None = None
        self.frozen: dict[str, Service] = {}
        self.gateway: Gateway | None = None
        """Judge reward functions' way to the frozen models' services (`rl.services.gateway`), opened on first use."""
        self.run_log: RunLog | None = None
        self.published: Fingerprints | None = None
        """The fingerprints of the newest published version (None before the first sync, or without attestation)."""
        self.on_trainer_lost: Callable[[str], None] | None = None
        """Told (from any thread) why the trainer's mesh failed, instead of the run stopping: `rl.loop.recovery`."""
        self.trainer_pids: list[int] = []
        """The trainer ranks' process ids (what the recovery watches on this host and kills when it restarts them)."""
        self.trainer_calls: dict[str, int] = {}
        """The trainer calls in flight, by name (`train step`, `weight push`, ...): what a lost trainer was doing."""
        self._trainer_procs: Any = None
        self._trainer_meshes: list[str] = []
        """Every trainer mesh's name, oldest first: the last is the live trainer's (a report of an older one is late)."""
        self._planned_steps = 0
        self._proc_meshes: list[Any] = []
        self._store_started = False
        self._store_procs: Any = None
        """The weight store's processes on the trainer hosts (None: the store is in the launcher's process)."""
        self._shutting_down = False
        self._actors_ready = False
        self._previous_fault_hook: Callable[[Any], None] | None = None
        self._scoring_slots = asyncio.Semaphore(config.run.max_concurrent_scoring)

    @property
    def services(self) -> list[Service]:
        return [service for service in (self.generators, self.reward) if service is not None] + list(
            self.frozen.values()
        )

    async def start(self, stop_token_ids: list[int], planned_steps: int) -> None:
        """Start the store and spawn the actors, each kind on its own processes."""
        config, trainer = self.config, self.with_trainer
        await self._open()
        self._planned_steps = planned_steps
        transport = config.weight_sync.transport
        lora = config.trainer.lora if config.trainer.lora.enabled else None
        self.generators = self._generator_service(Generator, stop_token_ids, lora)
        self.reward = self._reward_service("reward", self.placement)
        for name, model in config.models.items():
            args = (frozen_generator(config.generator, model), model.path, transport, stop_token_ids)
            self.frozen[name] = Service(
                f"frozen_{name}",
                Generator,
                lambda replica, args=args: (*args, replica),
                replicas=model.replicas,
                config=config.services.models,
                spawn_procs=self.placement.frozen_procs(name),
                on_fatal=self.stop_run,
                config_key="services.models",
                release="shutdown",
            )
        trainer_started = self._start_trainer() if trainer else asyncio.sleep(0)
        frozen_started = asyncio.gather(*(service.start() for service in self.frozen.values()))
        start = time.perf_counter()
        say(starting_line(config, trainer))
        await asyncio.gather(trainer_started, self.generators.start(), self.reward.start(), frozen_started)
        say(f"actors ready in {time.perf_counter() - start:.0f} s")
        if self.placement.hosts:
            say(await self._hosts_line())
        for actor in self.reward.actors():
            await self._connect_models(actor)
        self._actors_ready = True
        reset_peaks()  # the launcher's step peaks start after the start-up

    async def _open(self) -> None:
        """What comes before any actor: the fault hook, the run log, the hosts and (with a trainer) the weight store."""
        config = self.config
        self._previous_fault_hook = monarch.actor.unhandled_fault_hook
        monarch.actor.unhandled_fault_hook = self._on_actor_failure
        monarch.config.configure(cleanup_timeout="10s")
        self.run_log = RunLog(config.run.output_dir)
        if self.with_trainer:
            weight_sync.check_shared_memory(config)  # removes dead runs' weight files first
        await asyncio.to_thread(self.placement.allocate)  # the [cluster] hosts of each role
        if self.with_trainer:
            await self._start_store()

    def _generator_service(self, actor_class: type, stop_token_ids: list[int], *extra: Any) -> Service:
        """The policy's generator service of `actor_class` replicas, built with `extra` after the replica's id
        (`Generator`: the LoRA config or None; `actors.tenant_generator`: every tenant's)."""
        config = self.config
        generator_args = (config.generator, config.model.path, config.weight_sync.transport, stop_token_ids)
        return Service(
            "generator",
            actor_class,
            lambda replica: (*generator_args, replica, *extra),
            replicas=config.generator.num_replicas,
            config=config.services.generator,
            on_fatal=self.stop_run,
            prepare=self._load_policy,
            release="shutdown",
            spawn_procs=self.placement.replica_procs("generator", gpus_per_proc=config.generator.tensor_parallel_size),
        )

    def _reward_service(self, name: str, placement: Placement) -> Service:
        """The run's reward service `name` on `placement`'s reward processes: each replica scores with the run's tasks
        and rubrics, reaches its frozen models' services, and seeds its randomness with the run's seed and its id."""
        config = self.config
        model_paths = {model_name: model.path for model_name, model in config.models.items()}
        reward_args = (
            config.tasks,
            config.run.reward_concurrency,
            model_paths,
            config.generator.eval_sampling,
            config.run.seed,
        )
        return Service(
            name,
            RewardActor,
            lambda replica: (*reward_args, replica),
            replicas=config.services.reward.replicas,
            config=config.services.reward,
            spawn_procs=placement.replica_procs("reward"),
            on_fatal=self.stop_run,
            prepare=self._connect_models,
        )

    async def _start_store(self) -> None:
        """The weight store: its tensors on the trainer's own hosts when it has some (one process per host), so the
        launcher holds no weight bytes; else in the launcher's process (`rl.weights.sync`)."""
        if "trainer" in self.placement.hosts:
            self._store_procs = self.placement.spawn_procs("trainer", per_host={"procs": 1})
        await weight_sync.initialize_store(self._store_procs)
        self._store_started = True

    async def _stop_store(self) -> None:
        """Drop the store's data and metadata, then stop the volumes' processes (a lost host's may not answer)."""
        if self._store_started:
            self._store_started = False
            await asyncio.gather(weight_sync.shutdown_store(), return_exceptions=True)
        if self._store_procs is not None:
            procs, self._store_procs = self._store_procs, None
            await asyncio.gather(asyncio.wait_for(procs.stop(), 8), return_exceptions=True)

    async def _hosts_line(self) -> str:
        """Where each trainer rank and replica runs, by the name its host gives itself (a run on allocated hosts)."""
        ranks = list((await self.trainer.host.call()).values()) if self.trainer is not None else []
        services = {
            service.name: [await actor.host.call_one() for actor in service.actors()] for service in self.services
        }
        return hosts_line(ranks, services)

    async def _start_trainer(self) -> None:
        """Spawn the trainer's mesh (every rank, a new mesh name each time) and wait until it has loaded the model."""
        config = self.config
        self._trainer_meshes.append("trainer" if not self._trainer_meshes else f"trainer_{len(self._trainer_meshes)}")
        self.trainer, self._trainer_procs = await spawn_trainer(
            self.placement.spawn_procs,
            config.trainer,
            PolicyTrainer,
            config.trainer,
            config.loss,
            config.model.path,
            self._planned_steps,
            mesh_name=self._trainer_meshes[-1],
            weight_transport=config.weight_sync.transport,
            wire_dtype=config.generator.dtype,
            weight_delta=config.weight_sync.delta,
            delta_full_every=config.weight_sync.delta_full_every,
        )
        self._proc_meshes.append(self._trainer_procs)
        await asyncio.wait_for(self.trainer.initialized, config.services.generator.start_timeout_s)
        self.trainer_pids = sorted((await self.trainer.ping.call()).values())

    async def restart_trainer(self) -> None:
        """Stop the lost trainer's mesh (its ranks still running are killed by pid, their weight files removed)
        and start a new one: every rank, the model loaded from `model.path` again."""
        procs, pids = self._trainer_procs, self.trainer_pids
        self._proc_meshes.remove(procs)
        await asyncio.gather(asyncio.wait_for(procs.stop(), 8), return_exceptions=True)
        await asyncio.to_thread(reap, local_processes(pids), 5)
        weight_sync.remove_dead_shared_files()
        await self._start_trainer()

    def _on_actor_failure(self, failure: Any) -> None:
        """Monarch's hook for an actor that died: a replica goes to its service, anything else stops the run.

        Returning normally tells Monarch the fault is handled; the run then stops through ordinary
        cancellation (teardown included), and the CLI tells it apart from a user's Ctrl-C by the
        controller's `actor_failures`. (Monarch's own answer, a KeyboardInterrupt delivered to the
        main thread, can be delayed indefinitely: see rl/processes/interrupts.py.)
        """
        if self._shutting_down:
            return  # a slow teardown (e.g. vLLM freeing its engine) is not a failure of the run
        if any(service.handle_failure(failure) for service in self.services) or failure.mesh_name.startswith("logger-"):
            return  # a replica: its service replaces it (Monarch's per-process logger mesh fails along with any process)
        mesh = failure.mesh_name.rpartition("-")[0].removesuffix(RENDEZVOUS_SUFFIX)  # Monarch appends "-<id>"
        if mesh in self._trainer_meshes[:-1]:
            return  # a trainer already replaced, reported late (or stopped by its restart)
        if mesh == self._trainer_meshes[-1] and self.on_trainer_lost is not None:
            self.on_trainer_lost(failure.report())
            return
        self.stop_run(failure.report() + "\n" + RESUME_HINT)

    async def _load_policy(self, generator: Any) -> None:
        """A replacement generator loads the current policy version through the normal weight path and, when the run
        attests its syncs, proves it before it takes traffic (else it fails to start)."""
        if (policy_version := self.policy_version()) > 0:
            update = await generator.update_weights.call_one(policy_version, self.published)
            if update.needs_full:  # the version went as a delta, and a new replica has no base
                await self.push_weights(policy_version, full=True)
                update = await generator.update_weights.call_one(policy_version, self.published)
            if (reason := full_refusal(update)) is not None:
                raise RuntimeError(reason)

    async def _connect_models(self, reward: Any) -> None:
        """Judge reward functions in `reward` reach the frozen models through the gateway to their services."""
        if self.frozen:
            if self.gateway is None:
                self.gateway = open_gateway(self.frozen)
            await reward.connect_models.call_one(self.gateway.actor, list(self.frozen))

    @property
    def frozen_actors(self) -> dict[str, list[Any]]:
        """Each frozen model's healthy replica actors (for `judge` reward functions in the reward actors)."""
        return {name: service.actors() for name, service in self.frozen.items()}

    async def generate(
        self, request: GenerationRequest, sampling: SamplingConfig, key: str, sampler: str = POLICY
    ) -> Completion:
        """One completion from the policy's generators or frozen model `sampler` (sticky by `key`); raises `GenerationFailed` if the generator failed it."""
        service = self.generators if sampler == POLICY else self.frozen[sampler]
        [result] = await service.generate.route([request], sampling, key=key)
        if isinstance(result, GenerationFailed):
            raise result
        return result

    async def prompt_logprobs(self, name: str, sequences: list[list[int]]) -> list[list[float]]:
        """Each sequence's per-token logprobs under frozen model `name` ("policy" = the live generators): the teachers'
        scoring, at most `run.max_concurrent_scoring` sequences at once, its seconds in `time/scoring_s`."""
        service = self.generators if name == POLICY else self.frozen[name]

        async def one(ids: list[int]) -> list[float]:
            async with self._scoring_slots:
                return await service.prompt_logprobs.route(ids)

        with timer("scoring"):
            return list(await asyncio.gather(*(one(ids) for ids in sequences)))

    def reference_logprobs(self, sequences: list[list[int]]) -> Awaitable[list[list[float]]]:
        """Each sequence's per-token logprobs under the trainer's reference model (`loss.kl_coef` > 0)."""
        return self.trainer_call(self.trainer.logprobs.call_one(sequences, reference=True), "logprobs")

    async def score(self, group: RolloutGroup) -> RolloutGroup:
        """The group scored by a reward actor; a reward actor that fails marks every rollout an ERROR (TIMEOUT when it timed out)."""
        try:
            return await self.reward.score_group.route(group)
        except Exception as exc:
            status = RolloutStatus.TIMEOUT if getattr(exc, "timed_out", False) else RolloutStatus.ERROR
            for rollout in group.rollouts:
                rollout.status = status
                rollout.error = f"reward actor failed: {exc}"
            return group

    async def push_weights(self, policy_version: int, full: bool = False) -> Fingerprints | None:
        """The trainer publishes its weights as `policy_version` within `run.weight_sync_timeout_s`; returns the
        version's fingerprints when the run attests its syncs (`weight_sync.attest`), kept for replacements too.
        `full`: the last published version once more, whole (for generators that cannot apply its delta).
        Non-finite weights (seen in the fingerprints) raise `NonFiniteWeights` before any generator loads them."""
        push = self.trainer.push_weights.call_one(policy_version, self.config.weight_sync.attest, full)
        timeout_s = self.config.run.weight_sync_timeout_s
        what = f"trainer weight push (policy version {policy_version})"
        published = await self._in_flight(within(push, what, "run.weight_sync_timeout_s", timeout_s), "weight push")
        if published is not None and (broken := published.non_finite()):
            raise NonFiniteWeights(
                f"the trainer's weights of policy version {policy_version} are not finite ({', '.join(broken[:3])}"
                f"{', ...' if len(broken) > 3 else ''}); no generator loads them. Lower `trainer.lr` or clip harder, "
                f"then {RESUME_HINT}"
            )
        self.published = published
        return published

    async def check_adapter_served(self, policy_version: int) -> None:
        """After an adapter sync: every generator's logprobs of `SYNC_PROBE` are the trainer's (within
        `trainer.lora.sync_check_tolerance`), else `AdapterNotServed`. An adapter that did not reach a generator, or
        reached it and is not applied, then stops the run instead of the rollouts sampling an older policy."""
        trainer = await self.trainer_call(self.trainer.logprobs.call_one(SYNC_PROBE), "probe logprobs")
        served = await self.generators.prompt_logprobs.fanout(
            SYNC_PROBE, timeout_s=self.config.run.weight_sync_timeout_s
        )
        tolerance = self.config.trainer.lora.sync_check_tolerance
        for index, logprobs in enumerate(served):
            gap = max(abs(a - b) for a, b in zip(trainer, logprobs))
            if not gap <= tolerance:  # a NaN fails too
                raise AdapterNotServed(
                    f"generator replica {index} does not serve the adapter of policy version {policy_version}: its "
                    f"logprobs of a probe differ from the trainer's by {gap:.3g} (trainer.lora.sync_check_tolerance = "
                    f"{tolerance}); {RESUME_HINT}"
                )

    def trainer_call(self, call: Awaitable[Any], what: str) -> Awaitable[Any]:
        """A trainer call (not the weight push) within `trainer.call_timeout_s`."""
        timeout_s = self.config.trainer.call_timeout_s
        return self._in_flight(within(call, f"trainer {what}", "trainer.call_timeout_s", timeout_s), what)

    async def _in_flight(self, call: Awaitable[Any], what: str) -> Any:
        """`call`, counted in `trainer_calls` under `what` while it runs."""
        self.trainer_calls[what] = self.trainer_calls.get(what, 0) + 1
        try:
            return await call
        finally:
            self.trainer_calls[what] -= 1
            if not self.trainer_calls[what]:
                del self.trainer_calls[what]

    async def train_step(self, micro_batches: list[Any]) -> dict[str, float]:
        """One optimizer step on the trainer within `trainer.call_timeout_s`; its metrics as the run logs them (`loss`
        and names with a `/` as they are, the others under `train/`)."""
        metrics = await self.trainer_call(self.trainer.train_step.call_one(micro_batches), "train step")
        return {key if key == "loss" or "/" in key else f"train/{key}": value for key, value in metrics.items()}

    async def gather_states(self, step: int) -> list[dict[str, Any]]:
        """The trainer's and reward replicas' metric states for `step` (generators record nothing: never wait behind generation),
        within `run.metrics_timeout_s`: a trainer that misses it stops the run, a reward replica is left out of the step.
        With them, every process's peak memory during the step (`rl.metrics.memory`): the actors' (generators' too,
        through a concurrent endpoint; one that does not answer within `MEMORY_TIMEOUT_S` is left out) and the launcher's."""
        trainer, timeout_s = self.trainer, self.config.run.metrics_timeout_s
        actors = [trainer, *(actor for service in self.services for actor in service.actors())]
        (states, missed), (memory, _) = await asyncio.gather(
            gather_states([trainer, *self.reward.actors()], timeout_s),
            gather_states(actors, min(timeout_s, MEMORY_TIMEOUT_S), "memory_states"),
        )
        states += [*memory, peak_states("launcher")]
        if any(mesh is trainer for mesh in missed):
            raise DeadlineMissed(
                f"gathering the trainer's metric states took longer than run.metrics_timeout_s={timeout_s} s "
                f"(or failed); {RESUME_HINT}"
            )
        if missed:
            warn(
                f"{len(missed)} reward replica(s) did not hand over their metric states within "
                f"run.metrics_timeout_s; left out of step {step}"
            )
        return states

    async def save_checkpoint(self, path: Path, weights_only: bool = False) -> None:
        """The roles' part of a checkpoint: the trainer's model, optimizer (not with `weights_only`) and RNG, each reward
        replica's RNG, the services' counters."""
        save = self.trainer_call(self.trainer.save_checkpoint.call_one(str(path), weights_only), "checkpoint save")
        await asyncio.gather(
            save, self.reward.save_rng.fanout(str(path), timeout_s=self.config.services.reward.call_timeout_s)
        )
        checkpoint.write(path, checkpoint.SERVICES, {service.name: service.counters() for service in self.services})

    async def load_checkpoint(self, path: Path, service_counters: bool = True) -> None:
        """The roles' part of checkpoint `path`; `service_counters`: also the services' counters (a resume continues
        them; a recovery inside the run keeps its live services' own)."""
        load = self.trainer_call(self.trainer.load_checkpoint.call_one(str(path)), "checkpoint load")
        await asyncio.gather(
            load, self.reward.load_rng.fanout(str(path), timeout_s=self.config.services.reward.call_timeout_s)
        )
        if not service_counters:
            return
        saved = checkpoint.read(path, checkpoint.SERVICES)
        for service in self.services:
            if service.name in saved:
                service.restore_counters(saved[service.name])

    async def stop(self) -> None:
        """Stop every actor process and the store; safe after a partial start."""
        self._shutting_down = True
        actor_processes = monarch_processes()
        await asyncio.gather(
            self._stop_trainer(), *(service.stop() for service in self.services), return_exceptions=True
        )
        await asyncio.to_thread(reap, actor_processes, 5)  # a stopped mesh's processes may still be exiting
        self._proc_meshes = []
        self._actors_ready = False
        await self._stop_store()
        await asyncio.to_thread(self.placement.release)
        if self.gateway is not None:
            self.gateway.close()
        if self.run_log is not None:
            self.run_log.close()
        if self._previous_fault_hook is not None:
            trainer_meshes = [name + suffix for name in self._trainer_meshes for suffix in ("", RENDEZVOUS_SUFFIX)]
            monarch.actor.unhandled_fault_hook = after_run_fault_hook(
                self.services, self._previous_fault_hook, trainer_meshes
            )
            self._previous_fault_hook = None

    async def _stop_trainer(self) -> None:
        if self._actors_ready and self.trainer is not None:
            await asyncio.gather(asyncio.wait_for(self.trainer.release_weights.call(), 10), return_exceptions=True)
        stopping = asyncio.gather(*(procs.stop() for procs in self._proc_meshes), return_exceptions=True)
        try:
            await asyncio.wait_for(stopping, 8)
        except TimeoutError:
            pass  # a mesh stops only once its actors have started (vLLM may still be loading): reaped below
