"""The Controller owns a run: it reads like the GRPO loop it drives.

    producer:  admitted row → group_size rollouts (generation ⇄ environment) → scoring → buffer
    consumer:  buffer → advantages → packed batch → train step → weight push → generator reload

The producer admits rows one at a time (`rl.loop.admission`): at most `run.max_concurrent_rollouts`
generate at once, and no more than `run.max_policy_staleness` steps' worth of rows ahead of the
policy version (0 = synchronous). Each row's group enters the buffer as soon as it is scored; the
buffer evicts a group that finished too late for the budget. The run ends after `run.steps` steps
or when the data runs out (`run.epochs`, `run.max_rows`). All run state that a resume needs
(step, policy version, data cursor) lives in `RunState`.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable

import monarch.actor
import monarch.config
from tqdm import tqdm

from actors.trainer import PolicyTrainer
from env_types.renderer_env import Completion, GenerationRequest
from rl import checkpoint, run_dir as run_dirs
from rl.weights import sync as weight_sync
from rl.loop.admission import Admission
from rl.algorithms.config import POLICY
from rl.algorithms.samples import SampleBuilder
from rl.assets import resolve_model_path
from rl.batching import split_micro_batches
from rl.prefix_packing import pack_batch, packing_metrics
from rl.loop.buffer import RolloutBuffer, is_frozen_sampled
from rl.processes.cluster import Placement
from rl.config import Config, SamplingConfig, dump_toml
from rl.loop.data import RowStream, row_limit
from rl.loop.frozen_models import FrozenModels, mark_frozen, task_algorithms
from rl.processes.interrupts import monarch_processes, reap
from rl.metrics import MetricsLogger, timer
from rl.metrics.actor import gather_states
from rl.metrics.run_log import RunLog
from rl.metrics.samples import SampleLogger
from rl.metrics.standard import reward_metrics, rollout_metrics
from rl.training.precision import MismatchWatch
from env_types.renderer import stop_token_ids
from rl.services.breaker import CircuitBreaker, group_failure
from rl.loop.roles import generator_service, reward_service
from rl.services.gateway import Gateway, open_gateway
from rl.services.service import Service, after_run_fault_hook
from rl.processes.trainer_mesh import spawn_trainer
from rollouts.fanout import RolloutContext, RolloutFn, rollout_group
from rollouts.types import RolloutGroup, RolloutStatus
from tasks.build import BuiltTask, build_task


RESUME_HINT = "resume from the last checkpoint with `rlmesh train --resume RUN_DIR`"


class DeadlineMissed(RuntimeError):
    """A trainer call or the end-of-step metric gathering missed its deadline: the run stops, as on the trainer's death."""


def train_group_id(row_index: int) -> str:
    """Id of the group of training row `row_index` (rollout ids and sampling seeds derive from it)."""
    return f"train/row={row_index}"


def row_index_of(group_id: str) -> int:
    return int(group_id.removeprefix("train/row="))


@dataclass
class RunState:
    """Everything about the run's progress in one place; a checkpoint saves it as is."""

    step: int = 0
    """Optimizer steps done (consumed batches; the policy version lags it only by batches with no sample to train)."""
    policy_version: int = 0
    """Version of the newest weights; the generators run it once the step's sync is done."""
    data_cursor: int = 0
    """Every training row below this index has been consumed (trained, dropped, or evicted as stale)."""
    rows_done_ahead: list[int] = field(default_factory=list)
    """Rows at or above `data_cursor` already consumed (groups finish out of row order)."""

    def mark_rows_done(self, row_indices: list[int]) -> None:
        done = set(self.rows_done_ahead) | set(row_indices)
        while self.data_cursor in done:
            done.remove(self.data_cursor)
            self.data_cursor += 1
        self.rows_done_ahead = sorted(done)


@dataclass
class GenerationStats:
    """What the producer did since the consumer last looked; `seconds` counts time with any row generating."""

    seconds: float = 0.0
    completion_tokens: int = 0
    dropped_groups: int = 0
    dropped_zero_adv_groups: int = 0
    running: int = 0
    busy_since: float = 0.0

    def row_started(self) -> None:
        if self.running == 0:
            self.busy_since = time.perf_counter()
        self.running += 1

    def row_finished(self, group: RolloutGroup, drop: str | None) -> None:
        """`drop`: the metric key the group was dropped under (`SampleBuilder.drop_reason`), None if kept."""
        self.running -= 1
        if self.running == 0:
            self.seconds += time.perf_counter() - self.busy_since
        self.completion_tokens += sum(rollout.num_completion_tokens for rollout in group.rollouts)
        self.dropped_groups += drop is not None
        self.dropped_zero_adv_groups += drop == "rollouts/dropped_zero_adv_groups"

    def drain(self) -> GenerationStats:
        now = time.perf_counter()
        seconds = self.seconds + (now - self.busy_since if self.running else 0.0)
        drained = GenerationStats(seconds, self.completion_tokens, self.dropped_groups, self.dropped_zero_adv_groups)
        self.seconds, self.completion_tokens, self.dropped_groups, self.dropped_zero_adv_groups, self.busy_since = 0.0, 0, 0, 0, now
        return drained


class Controller:
    def __init__(self, config: Config, resume_from: Path | None = None):
        """`resume_from`: a committed checkpoint directory to continue from (see `rl.checkpoint`)."""
        self.config = config
        self.resume_from = resume_from
        self.state = RunState(**checkpoint.read_run_state(resume_from)) if resume_from else RunState()
        self.tasks: dict[str, BuiltTask] = {task_config.name: build_task(task_config) for task_config in config.tasks}
        model_path = resolve_model_path(config.model.path)
        self.renderers = {name: task.config.renderer.build(model_path) for name, task in self.tasks.items()}
        self.stop_token_ids = sorted({token for renderer in self.renderers.values() for token in stop_token_ids(renderer)})
        self.pad_token_id = self.stop_token_ids[0]
        train_rows = {name: task.load_rows("train") for name, task in self.tasks.items()}
        limit = row_limit(train_rows, epochs=config.run.epochs, max_rows=config.run.max_rows)
        self.stream = RowStream(
            train_rows, {name: task.config.weight for name, task in self.tasks.items()}, seed=config.run.seed, limit=limit
        )
        self.stream.seek(self.state.data_cursor)
        self.planned_steps = config.run.steps if limit is None else min(config.run.steps, limit // config.run.groups_per_step)
        """Optimizer steps the LR schedule is sized for; fewer happen if dropped groups use up the data."""
        self.validation_rows = [
            (name, row) for name, task in sorted(self.tasks.items()) for row in task.load_rows("validation")
        ][: config.run.eval_groups]
        self.buffer = RolloutBuffer(max_staleness=config.run.max_policy_staleness)
        self.admission = Admission(
            max_concurrent=config.run.max_concurrent_rollouts,
            max_staleness=config.run.max_policy_staleness,
            rows_per_step=config.run.groups_per_step,
            policy_version=self.state.policy_version,
        )
        self.breaker = CircuitBreaker(config.services.breaker, on_open=self._stop_run)
        self.nonfinite_steps_in_row = 0
        self.generation_stats = GenerationStats()
        self.mismatch_watch = MismatchWatch(config.run.mismatch_warn_factor, config.run.mismatch_warn_floor)
        self.algorithms = task_algorithms(config)
        self.frozen = FrozenModels(config, on_fatal=self._stop_run)
        self.samples = SampleBuilder(
            self.algorithms, self.renderers, lambda name, seqs: self.frozen.prompt_logprobs(name, seqs, policy=self.generators)
        )
        self._proc_meshes: list[Any] = []
        self.placement = Placement(config)
        self.generators: Service | None = None
        self.reward: Service | None = None
        self.gateway: Gateway | None = None
        self.actor_failures: list[str] = []
        self._store_started = False
        self._shutting_down = False
        self._actors_ready = False
        self._run_task: asyncio.Task | None = None
        self._previous_fault_hook: Callable[[Any], None] | None = None
        self.run_log: RunLog | None = None

    def _on_actor_failure(self, failure: Any) -> None:
        """Monarch's hook for an actor that died: keep its report and cancel the run's task.

        Returning normally tells Monarch the fault is handled; the run then stops through
        ordinary cancellation (teardown included), and the CLI tells it apart from a user's
        Ctrl-C by `actor_failures`. (Monarch's own answer, a KeyboardInterrupt delivered to the
        main thread, can be delayed indefinitely: see rl/processes/interrupts.py.)
        """
        if self._shutting_down:
            return  # a slow teardown (e.g. vLLM freeing its engine) is not a failure of the run
        if any(service.handle_failure(failure) for service in self.services) or failure.mesh_name.startswith("logger-"):
            return  # a replica: its service replaces it (Monarch's per-process logger mesh fails along with any process)
        self._stop_run(failure.report() + "\n" + RESUME_HINT)

    def _stop_run(self, message: str) -> None:
        """Keep `message` for the CLI and cancel the run's task (from any thread)."""
        self.actor_failures.append(message)
        if self._run_task is not None:
            self._run_task.get_loop().call_soon_threadsafe(self._run_task.cancel)

    @property
    def services(self) -> list[Service]:
        return [service for service in (self.generators, self.reward) if service is not None] + list(self.frozen.services.values())

    async def setup(self) -> None:
        """Start the store and spawn the actors, each kind on its own processes."""
        self._previous_fault_hook = monarch.actor.unhandled_fault_hook
        monarch.actor.unhandled_fault_hook = self._on_actor_failure
        monarch.config.configure(cleanup_timeout="10s")
        self.run_log = RunLog(self.config.run.output_dir)
        weight_sync.remove_dead_shared_files()
        await weight_sync.initialize_store()
        self._store_started = True
        generator_config = self.config.generator
        spawn_procs = (await asyncio.to_thread(self.placement.allocate)).spawn_procs  # the [cluster] hosts of each role
        self.trainer, trainer_procs = await spawn_trainer(spawn_procs, self.config, PolicyTrainer, self.config, self.planned_steps)
        self._proc_meshes = [trainer_procs]
        self.generators = generator_service(
            self.config, self.stop_token_ids, on_fatal=self._stop_run, load_policy=self._load_policy,
            spawn_procs=self.placement.replica_procs("generator", gpus_per_proc=generator_config.tensor_parallel_size),
        )
        self.reward = reward_service(
            self.config, on_fatal=self._stop_run, prepare=self._connect_models, spawn_procs=self.placement.replica_procs("reward")
        )
        trainer_started = asyncio.wait_for(self.trainer.initialized, self.config.services.generator.start_timeout_s)
        await asyncio.gather(trainer_started, self.generators.start(), self.reward.start(), self.frozen.setup(self.stop_token_ids, self.placement))
        for actor in self.reward.actors():
            await self._connect_models(actor)
        self._actors_ready = True
        if self.resume_from is not None:
            await self.restore(self.resume_from)

    async def _load_policy(self, generator: Any) -> None:
        """A replacement generator loads the current policy version through the normal weight path."""
        if self.state.policy_version > 0:
            await generator.update_weights.call_one(self.state.policy_version)

    async def _connect_models(self, reward: Any) -> None:
        """Judge reward functions in `reward` reach the frozen models through the gateway to their services."""
        if self.frozen.services:
            if self.gateway is None:
                self.gateway = open_gateway(self.frozen.services)
            await reward.connect_models.call_one(self.gateway.actor, list(self.frozen.services))

    async def restore(self, path: Path) -> None:
        """Load a checkpoint into every actor; the generators get its weights through the normal sync."""
        timeout_s = self.config.services.reward.call_timeout_s
        load = self._trainer_call(self.trainer.load_checkpoint.call_one(str(path)), "checkpoint load")
        await asyncio.gather(load, self.reward.broadcast("load_rng", str(path), timeout_s=timeout_s))
        checkpoint.load_rng(path, "controller")
        saved = checkpoint.read_service_counters(path)
        for service in self.services:
            if service.name in saved:
                service.restore_counters(saved[service.name])
        await self.sync_weights(self.state.policy_version)

    async def save_checkpoint(self, run_dir: Path, record: tuple[dict[str, Any], dict[str, Any]] | None = None) -> float:
        """Write a committed checkpoint of the current step, with the step's reduced `record` (metrics, samples)
        when it has one; returns seconds spent."""
        start = time.perf_counter()
        tmp = checkpoint.begin(run_dir, self.state.step)
        timeout_s = self.config.services.reward.call_timeout_s
        save = self._trainer_call(self.trainer.save_checkpoint.call_one(str(tmp)), "checkpoint save")
        await asyncio.gather(save, self.reward.broadcast("save_rng", str(tmp), timeout_s=timeout_s))
        if record is not None:
            checkpoint.write_step_record(tmp, *record)
        checkpoint.save_rng(tmp, "controller")
        checkpoint.write_service_counters(tmp, {service.name: service.counters() for service in self.services})
        checkpoint.write_run_state(tmp, self.state)
        (tmp / "config.toml").write_text(dump_toml(self.config))
        checkpoint.commit(run_dir, tmp, self.state.step, keep=self.config.checkpoint.keep)
        return time.perf_counter() - start

    def checkpoint_due(self) -> bool:
        every = self.config.checkpoint.every_steps
        return self.state.step == self.planned_steps or (every > 0 and self.state.step % every == 0)

    async def shutdown(self) -> None:
        """Stop every actor process and the store; safe after a partial setup."""
        self._shutting_down = True
        actor_processes = monarch_processes()
        await asyncio.gather(self._stop_trainer(), *(service.stop() for service in self.services), return_exceptions=True)
        await asyncio.to_thread(reap, actor_processes, 5)  # a stopped mesh's processes may still be exiting
        self._proc_meshes = []
        self._actors_ready = False
        await asyncio.to_thread(self.placement.release)
        if self._store_started:
            self._store_started = False
            await weight_sync.shutdown_store()
        if self.gateway is not None:
            self.gateway.close()
        if self.run_log is not None:
            self.run_log.close()
        if self._previous_fault_hook is not None:
            monarch.actor.unhandled_fault_hook = after_run_fault_hook(self.services, self._previous_fault_hook)
            self._previous_fault_hook = None

    async def _stop_trainer(self) -> None:
        if self._actors_ready:
            await asyncio.gather(asyncio.wait_for(self.trainer.release_weights.call(), 10), return_exceptions=True)
        stopping = asyncio.gather(*(procs.stop() for procs in self._proc_meshes), return_exceptions=True)
        try:
            await asyncio.wait_for(stopping, 8)
        except asyncio.TimeoutError:
            pass  # a mesh stops only once its actors have started (vLLM may still be loading): reaped below

    async def generate(self, request: GenerationRequest, sampling: SamplingConfig, group_id: str) -> Completion:
        """One completion from the generator service (sticky by group); raises if the generator failed the request."""
        [result] = await self.generators.call("generate", [request], sampling, key=group_id)
        if isinstance(result, str):
            raise RuntimeError(result)
        return result

    async def generate_frozen(self, name: str, request: GenerationRequest, sampling: SamplingConfig, group_id: str) -> Completion:
        """One completion from frozen model `name`; raises if its generator failed the request."""
        [result] = await self.frozen.generate(name, [request], sampling, key=group_id)
        if isinstance(result, str):
            raise RuntimeError(result)
        return result

    async def rollout_and_score(
        self, row_id: str, task_name: str, row: dict, group_size: int, sampling: SamplingConfig, sampler: str = POLICY,
        rollout_fn: RolloutFn | None = None,
    ) -> RolloutGroup:
        """A row's group: `group_size` rollouts on the generator service (or frozen model `sampler`), then its rewards.

        `rollout_fn` replaces the task's (an algorithm's own, e.g. sft's demonstrations, which generate nothing)."""
        task = self.tasks[task_name]

        def generate(request: GenerationRequest) -> Awaitable[Completion]:
            if sampler == POLICY:
                return self.generate(request, sampling, row_id)
            return self.generate_frozen(sampler, request, sampling, row_id)

        def context(sample_index: int) -> RolloutContext:
            return RolloutContext(
                row_id=row_id,
                sample_index=sample_index,
                task_name=task_name,
                task=task.task,
                renderer=self.renderers[task_name],
                env_config=task.config.env,
                generate=generate,
                run_seed=self.config.run.seed,
            )

        group = await rollout_group(row_id, task_name, row, group_size, rollout_fn or task.rollout_fn, context)
        if sampler == POLICY:
            for rollout in group.rollouts:
                rollout.metadata["generator_replica"] = self.generators.router.replica_of(row_id)
        else:
            mark_frozen([group], sampler)
        if group.rollouts and all(rollout.reward is not None for rollout in group.rollouts):
            return group  # the rollout_fn scored its own samples
        return await self.score(group)

    async def score(self, group: RolloutGroup) -> RolloutGroup:
        try:
            return await self.reward.call("score_group", group)
        except Exception as exc:
            status = RolloutStatus.TIMEOUT if getattr(exc, "timed_out", False) else RolloutStatus.ERROR
            for rollout in group.rollouts:
                rollout.status = status
                rollout.error = f"reward actor failed: {exc}"
            return group

    async def produce_row(self, row_index: int, task_name: str, row: dict) -> None:
        self.generation_stats.row_started()
        algorithm = self.samples.algorithms[task_name]
        group = await self.rollout_and_score(
            train_group_id(row_index), task_name, row, algorithm.rollouts_per_row(self.config.algorithm.group_size),
            self.config.generator.sampling, sampler=algorithm.config.sampler, rollout_fn=algorithm.rollout_fn(),
        )
        self.breaker.record(*group_failure(group))
        # the group's advantages are computed here, once; a dropped group gives its slot to another row
        drop = self.samples.drop_reason(group, self.config.trainer.seq_len)
        self.generation_stats.row_finished(group, drop)
        if drop is None:
            await self.buffer.put(group)
        else:
            self.state.mark_rows_done([row_index])
        await self.admission.finish(drop is None)

    async def produce(self) -> None:
        """Admit rows one by one as the budgets allow; each row's group reaches the buffer when it finishes."""
        rows_done_ahead = set(self.state.rows_done_ahead)  # consumed before a resume: not drawn again
        async with asyncio.TaskGroup() as rows:
            while True:
                await self.admission.acquire()
                row_index = self.stream.cursor
                while (drawn := self.stream.next()) is not None and row_index in rows_done_ahead:
                    row_index = self.stream.cursor
                if drawn is None:
                    await self.admission.finish(accepted=False)
                    break
                task_name, row = drawn
                rows.create_task(self.produce_row(row_index, task_name, row))
        self.buffer.close()

    async def validate(self) -> dict[str, float]:
        """Held-out reward through the same rollout path, one sample per row."""
        if not self.validation_rows:
            return {}
        groups = await asyncio.gather(
            *(
                self.rollout_and_score(f"eval/step={self.state.step}/{index}", task_name, row, 1, self.config.generator.eval_sampling)
                for index, (task_name, row) in enumerate(self.validation_rows)
            )
        )
        self.logger.log_rollouts(self.state.step, "eval", groups)
        return reward_metrics([rollout for group in groups for rollout in group.rollouts], prefix="eval/reward")

    async def train_step(self, groups: list[RolloutGroup]) -> dict[str, float]:
        """Advantages → packed micro-batches → one optimizer step → weights to the generators."""
        trainer_config = self.config.trainer
        all_samples, metrics = await self.samples.build(groups)
        samples = [sample for sample in all_samples if len(sample.input_ids) <= trainer_config.seq_len]
        metrics["rollouts/too_long"] = len(all_samples) - len(samples)
        if not samples:  # the weights do not change: the groups' admission slots go to other rows
            metrics["train/skipped"] = 1
            await self.admission.release_accepted(len(groups))
            return metrics
        batch = pack_batch(  # [R, L]: rows as wide as the widest, a multiple of the trainer's ranks
            samples, seq_len=trainer_config.seq_len, pad_token_id=self.pad_token_id, prefix_sharing=trainer_config.prefix_sharing,
            rows_multiple_of=trainer_config.num_procs * trainer_config.num_hosts,
            min_rows=trainer_config.num_procs * trainer_config.num_hosts * trainer_config.ppo_n_minibatches,
        )
        metrics.update(packing_metrics(batch))
        micro_batches = split_micro_batches(batch, trainer_config.micro_batch_size)
        with timer("train"):
            train_metrics = await self._trainer_call(self.trainer.train_step.call_one(micro_batches), "train step")
        metrics.update({key if key == "loss" or "/" in key else f"train/{key}": value for key, value in train_metrics.items()})
        if metrics.get("train/skipped_nonfinite_steps", 0) >= trainer_config.ppo_n_minibatches:
            return await self._nonfinite_step(metrics, len(groups))  # the weights did not change: no sync, same version
        self.nonfinite_steps_in_row = 0
        if "train/mismatch_k3" in metrics and (warning := self.mismatch_watch.check(metrics["train/mismatch_k3"])):
            tqdm.write(f"rlmesh: warning: {warning}", file=sys.stderr)

        with timer("weight_sync"):
            await self.sync_weights(self.state.policy_version + 1)
        if "train/clip_frac_low" in metrics:
            metrics["train/ppo_clip_frac"] = metrics["train/clip_frac_low"] + metrics["train/clip_frac_high"]
        return metrics

    async def _nonfinite_step(self, metrics: dict[str, float], rows: int) -> dict[str, float]:
        """A step whose every update was skipped for a non-finite gradient norm (its rows' slots go to other rows,
        as for a step with nothing to train); too many in a row stop the run."""
        self.nonfinite_steps_in_row += 1
        limit = self.config.trainer.max_nonfinite_steps
        message = (f"step {self.state.step + 1}: gradient norm {metrics.get('train/grad_norm')} is not finite; the update was "
                   f"skipped ({self.nonfinite_steps_in_row} in a row, trainer.max_nonfinite_steps = {limit})")
        tqdm.write(f"rlmesh: warning: {message}", file=sys.stderr)
        if self.nonfinite_steps_in_row >= limit:
            self._stop_run(f"{message}: stopping the run")
        await self.admission.release_accepted(rows)
        return metrics

    async def sync_weights(self, policy_version: int) -> None:
        """The trainer publishes its weights as `policy_version`; every generator reloads them; admission moves on."""
        async with self.generators.updating():  # a replacement generator loads the version before or after, never half-way
            push = self.trainer.push_weights.call_one(policy_version)
            await self._within(push, f"trainer weight push (policy version {policy_version})", "run.weight_sync_timeout_s",
                               self.config.run.weight_sync_timeout_s)
            await self.generators.broadcast("update_weights", policy_version, timeout_s=self.config.run.weight_sync_timeout_s)
            self.state.policy_version = policy_version
        await self.admission.set_policy_version(policy_version)

    async def run(self) -> dict[str, Any]:
        """The whole run: start the actors, train, stop them (also on error or Ctrl-C)."""
        self._run_task = asyncio.current_task()
        try:
            await self.setup()
            return await self.train()
        finally:
            await self.shutdown()

    async def train(self) -> dict[str, Any]:
        """Validate, then optimizer steps until `run.steps` or the data's end; returns the first and last validation metrics."""
        config = self.config
        run_lock = None
        if self.resume_from is not None:
            run_dir = self.resume_from.parent.parent  # locked by the launcher (rl.cli) before it repaired the logs
        else:
            run_dir, run_lock = run_dirs.claim_fresh(config.run_dir)
            (run_dir / "config.toml").write_text(dump_toml(config))
        if self.run_log is not None:
            self.run_log.move_into(run_dir)
        self.logger = MetricsLogger(config, run_dir)
        sample_logger = SampleLogger(
            config,
            {name: task.task.target for name, task in self.tasks.items()},
            reference_logprobs=(
                (lambda ids: self._trainer_call(self.trainer.logprobs.call_one(ids, reference=True), "logprobs"))
                if config.algorithm.kl_coef > 0 else None
            ),
        )
        summary: dict[str, Any] = {"run_dir": str(run_dir)}
        producer = asyncio.create_task(self.produce())
        try:
            if config.run.eval_every > 0 and self.state.step == 0:
                summary["eval_start"] = await self.validate()
                self.logger.log_step(0, {"policy_version": 0, **summary["eval_start"]})
            for _ in self.logger.progress(self.state.step, self.planned_steps):
                step_start = time.perf_counter()
                groups, evicted = await self._next_batch(producer)
                wait_seconds = time.perf_counter() - step_start
                if len(groups) < config.run.groups_per_step:  # the data ran out before the planned steps
                    summary["data_exhausted_at_step"] = self.state.step
                    if config.run.eval_every > 0 and self.state.step % config.run.eval_every != 0:
                        summary["eval_end"] = await self.validate()
                        self.logger.log_step(self.state.step, {"policy_version": self.state.policy_version, **summary["eval_end"]})
                    if self.state.step > 0:
                        await self.save_checkpoint(run_dir)
                    break
                metrics = self._rollout_metrics(groups, len(evicted), wait_seconds)
                train_start = time.perf_counter()
                step_metrics = await self.train_step(groups)
                busy = time.perf_counter() - train_start  # advantages, train step (all minibatches) and weight sync
                self.logger.log_rollouts(self.state.step + 1, "train", groups)  # with the advantages the step trained
                await sample_logger.record(groups, self.state.step + 1)
                for key in ("rollouts/dropped_groups", "rollouts/dropped_zero_adv_groups"):  # the producer's drops and the step's
                    step_metrics[key] += metrics[key]
                metrics.update(step_metrics)
                actor_states = await self._gather_states()
                self.state.mark_rows_done([row_index_of(group.group_id) for group in groups + evicted])
                metrics["perf/wait_time_ratio"] = wait_seconds / (wait_seconds + busy)
                metrics["perf/overlap_ratio"] = 1.0 - metrics["perf/wait_time_ratio"]
                self.state.step += 1
                is_last = self.state.step == self.planned_steps
                if config.run.eval_every > 0 and (self.state.step % config.run.eval_every == 0 or is_last):
                    eval_metrics = await self.validate()
                    metrics.update(eval_metrics)
                    if is_last:
                        summary["eval_end"] = eval_metrics
                metrics.update({key: value for service in self.services for key, value in service.metrics().items()})
                record, samples = self.logger.reduce_step({"policy_version": self.state.policy_version, **metrics}, actor_states)
                if self.checkpoint_due():  # the step's record is committed with it: a kill before the log line loses nothing
                    record["time/checkpoint_s"] = await self.save_checkpoint(run_dir, (record, samples))
                record["time/step_s"] = time.perf_counter() - step_start
                self.logger.write_step(self.state.step, record, samples)
        finally:
            producer.cancel()
            await asyncio.gather(producer, return_exceptions=True)
            self.logger.close()
            if run_lock is not None:
                run_lock.release()
        return summary

    async def _within(self, call: Awaitable[Any], what: str, key: str, timeout_s: float) -> Any:
        """Await an actor call within `timeout_s` (config key `key`); DeadlineMissed, naming both, instead of hanging."""
        try:
            return await asyncio.wait_for(call, timeout_s)
        except asyncio.TimeoutError:
            raise DeadlineMissed(f"{what} took longer than {key}={timeout_s} s; {RESUME_HINT}") from None

    def _trainer_call(self, call: Awaitable[Any], what: str) -> Awaitable[Any]:
        """A trainer call (not the weight push) within `trainer.call_timeout_s`."""
        return self._within(call, f"trainer {what}", "trainer.call_timeout_s", self.config.trainer.call_timeout_s)

    async def _gather_states(self) -> list[dict[str, Any]]:
        """The trainer's and reward replicas' metric states (generators record nothing: never wait behind generation),
        within `run.metrics_timeout_s`: a trainer that misses it stops the run, a reward replica is left out of the step."""
        trainer, rewards = self.trainer, self.reward.actors()
        states, missed = await gather_states([trainer, *rewards], self.config.run.metrics_timeout_s)
        if any(mesh is trainer for mesh in missed):
            raise DeadlineMissed(f"gathering the trainer's metric states took longer than run.metrics_timeout_s="
                                 f"{self.config.run.metrics_timeout_s} s (or failed); {RESUME_HINT}")
        if missed:
            tqdm.write(f"rlmesh: warning: {len(missed)} reward replica(s) did not hand over their metric states within "
                       f"run.metrics_timeout_s; left out of step {self.state.step + 1}", file=sys.stderr)
        return states

    async def _next_batch(self, producer: asyncio.Task) -> tuple[list[RolloutGroup], list[RolloutGroup]]:
        """The next batch from the buffer; a crashed producer raises here instead of hanging the run."""
        get = asyncio.ensure_future(self.buffer.get(self.config.run.groups_per_step, self.state.policy_version))
        await asyncio.wait([get, producer], return_when=asyncio.FIRST_COMPLETED)
        if producer.done() and producer.exception() is not None:
            get.cancel()
            producer.result()
        groups, evicted = await get  # the producer closes the buffer when the data runs out
        groups.sort(key=lambda group: row_index_of(group.group_id))  # row order, not completion order: packing and logs replay on resume
        await self.admission.release_accepted(len(evicted))
        return groups, evicted

    def _rollout_metrics(self, groups: list[RolloutGroup], evicted: int, wait_seconds: float) -> dict[str, float]:
        rollouts = [rollout for group in groups for rollout in group.rollouts]
        stats = self.generation_stats.drain()
        policy_sampled = [r for r in rollouts if r.turns and r.metadata.get("sampler", POLICY) == POLICY]  # frozen samplers never age
        offsets = [self.state.policy_version - min(r.policy_versions) for r in policy_sampled]
        metrics: dict[str, float] = {
            "rollouts/evicted_stale_groups": evicted,
            "rollouts/dropped_groups": stats.dropped_groups,
            "rollouts/dropped_zero_adv_groups": stats.dropped_zero_adv_groups,
            "async/version_offset_mean": sum(offsets) / len(offsets) if offsets else 0.0,
            "async/version_offset_max": max(offsets, default=0),
            "rollouts/policy_lag_max": max(
                (self.state.policy_version - group.min_policy_version for group in groups if not is_frozen_sampled(group)), default=0
            ),
            "time/generation_s": stats.seconds,
            "perf/sample_wait_time": wait_seconds,
            "perf/generation_tokens_per_s": stats.completion_tokens / stats.seconds if stats.seconds else 0.0,
        }
        metrics.update(rollout_metrics(groups))
        return metrics
