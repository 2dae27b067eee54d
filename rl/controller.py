"""The Controller owns a run: it reads like the GRPO loop it drives.

    producer:  rows → environments → generation ⇄ environment steps → scoring → buffer
    consumer:  buffer → advantages → packed batch → train step → weight push → generator reload

The two halves are joined by a bounded buffer of policy-version-tagged groups. The
producer may run `run.max_policy_staleness` batches ahead of training (0 = synchronous).
All run state that a resume needs (step, policy version, data cursor) lives in `RunState`.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import monarch.actor
import monarch.config
from monarch.actor import default_bootstrap_cmd, this_host
from tqdm import tqdm

from actors.generator import Generator
from actors.reward import RewardActor
from actors.trainer import PolicyTrainer
from env_types.renderer_env import GenerationRequest
from rl import checkpoint, weight_sync
from rl.algorithms.config import POLICY
from rl.algorithms.samples import SampleBuilder
from rl.assets import resolve_model_path
from rl.batching import pack_samples, split_micro_batches
from rl.buffer import RolloutBuffer, is_frozen_sampled
from rl.config import Config, SamplingConfig, dump_toml
from rl.data import RowStream
from rl.frozen_models import FrozenModels, mark_frozen, task_algorithms
from rl.interrupts import monarch_processes, reap
from rl.metrics import MetricsLogger, timer
from rl.metrics.actor import gather_states
from rl.metrics.run_log import RunLog
from rl.metrics.samples import SampleLogger
from rl.metrics.standard import reward_metrics, rollout_metrics
from rl.precision import MismatchWatch
from rl.renderer import stop_token_ids
from rollouts.runner import GroupSpec, collect_groups
from rollouts.types import RolloutGroup, RolloutStatus
from tasks.build import BuiltTask, build_task


def gpu_placement(device: str, *, first_gpu: int, gpus_per_proc: int) -> Callable[[Any], Any] | None:
    """Per-process `CUDA_VISIBLE_DEVICES` so each actor process owns its GPUs (None on CPU).

    One host: the trainer takes GPU 0, generator replica i the `tensor_parallel_size` GPUs after it.
    """
    if device != "cuda":
        return None

    def command(point: Any) -> Any:
        start = first_gpu + point.rank * gpus_per_proc
        gpus = ",".join(str(gpu) for gpu in range(start, start + gpus_per_proc))
        return default_bootstrap_cmd().with_env({"CUDA_VISIBLE_DEVICES": gpus})

    return command


def fresh_run_dir(run_dir: Path) -> Path:
    """`run_dir`, or `run_dir-1`, `run_dir-2`, ... if taken: a new run never appends to an old one."""
    candidate, suffix = run_dir, 0
    while candidate.exists() and any(candidate.iterdir()):
        suffix += 1
        candidate = run_dir.with_name(f"{run_dir.name}-{suffix}")
    candidate.mkdir(parents=True, exist_ok=True)
    return candidate


def train_group_id(row_index: int) -> str:
    """Id of the group of training row `row_index` (rollout ids and sampling seeds derive from it)."""
    return f"train/row={row_index}"


def row_index_of(group_id: str) -> int:
    return int(group_id.removeprefix("train/row="))


@dataclass
class RunState:
    """Everything about the run's progress in one place; a checkpoint saves it as is."""

    step: int = 0
    """Optimizer steps done (consumed batches, including skipped ones)."""
    policy_version: int = 0
    """Version of the newest weights; the generators run it once the step's sync is done."""
    data_cursor: int = 0
    """Every training row below this index has been consumed (trained, or evicted as stale)."""
    rows_done_ahead: list[int] = field(default_factory=list)
    """Rows at or above `data_cursor` already consumed (groups may finish out of row order)."""

    def mark_rows_done(self, row_indices: list[int]) -> None:
        done = set(self.rows_done_ahead) | set(row_indices)
        while self.data_cursor in done:
            done.remove(self.data_cursor)
            self.data_cursor += 1
        self.rows_done_ahead = sorted(done)


@dataclass
class GenerationStats:
    """What the producer spent since the consumer last looked."""

    seconds: float = 0.0
    completion_tokens: int = 0

    def drain(self) -> GenerationStats:
        drained = GenerationStats(self.seconds, self.completion_tokens)
        self.seconds, self.completion_tokens = 0.0, 0
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
        self.stream = RowStream(
            {name: task.load_rows("train") for name, task in self.tasks.items()},
            {name: task.config.weight for name, task in self.tasks.items()},
            seed=config.run.seed,
        )
        self.stream.seek(self.state.data_cursor)
        self.validation_rows = [
            (name, row) for name, task in sorted(self.tasks.items()) for row in task.load_rows("validation")
        ][: config.run.eval_groups]
        self.buffer = RolloutBuffer(
            capacity=config.run.groups_per_step * (config.run.max_policy_staleness + 1),
            max_staleness=config.run.max_policy_staleness,
        )
        self.generation_stats = GenerationStats()
        self.mismatch_watch = MismatchWatch(config.run.mismatch_warn_factor, config.run.mismatch_warn_floor)
        self.algorithms = task_algorithms(config)
        self.frozen = FrozenModels(config)
        self.samples = SampleBuilder(
            self.algorithms, self.renderers, lambda name, seqs: self.frozen.prompt_logprobs(name, seqs, policy=self.generators)
        )
        self.step_done = asyncio.Condition()
        self._replica = 0
        self._proc_meshes: list[Any] = []
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
        main thread, can be delayed indefinitely: see rl/interrupts.py.)
        """
        if self._shutting_down:
            return  # a slow teardown (e.g. vLLM freeing its engine) is not a failure of the run
        self.actor_failures.append(failure.report())
        if self._run_task is not None:
            self._run_task.get_loop().call_soon_threadsafe(self._run_task.cancel)

    async def setup(self) -> None:
        """Start the store and spawn the actors, each kind on its own processes."""
        self._previous_fault_hook = monarch.actor.unhandled_fault_hook
        monarch.actor.unhandled_fault_hook = self._on_actor_failure
        monarch.config.configure(cleanup_timeout="10s")
        self.run_log = RunLog(self.config.run.output_dir)
        await weight_sync.initialize_store()
        self._store_started = True
        generator_config = self.config.generator
        trainer_procs = this_host().spawn_procs(
            per_host={"procs": 1}, bootstrap_command=gpu_placement(self.config.trainer.device, first_gpu=0, gpus_per_proc=1)
        )
        generator_procs = this_host().spawn_procs(
            per_host={"procs": generator_config.num_replicas},
            bootstrap_command=gpu_placement(generator_config.device, first_gpu=1, gpus_per_proc=generator_config.tensor_parallel_size),
        )
        reward_procs = this_host().spawn_procs(per_host={"procs": 1})
        self._proc_meshes = [trainer_procs, generator_procs, reward_procs]
        self.trainer = trainer_procs.spawn("trainer", PolicyTrainer, self.config)
        self.generators = generator_procs.spawn("generator", Generator, self.config, self.stop_token_ids)
        self.reward = reward_procs.spawn("reward", RewardActor, self.config)
        await asyncio.gather(
            self.trainer.initialized, self.generators.initialized, self.reward.initialized, self.frozen.setup(self.stop_token_ids)
        )
        if self.frozen.actors:
            await self.reward.connect_models.call_one(self.frozen.actors)  # for judge reward functions
        self._actors_ready = True
        if self.resume_from is not None:
            await self.restore(self.resume_from)

    async def restore(self, path: Path) -> None:
        """Load a checkpoint into every actor; the generators get its weights through the normal sync."""
        await asyncio.gather(self.trainer.load_checkpoint.call_one(str(path)), self.reward.load_rng.call_one(str(path)))
        checkpoint.load_rng(path, "controller")
        await self.sync_weights(self.state.policy_version)

    async def save_checkpoint(self, run_dir: Path) -> float:
        """Write a committed checkpoint of the current step; returns seconds spent."""
        start = time.perf_counter()
        tmp = checkpoint.begin(run_dir, self.state.step)
        await asyncio.gather(self.trainer.save_checkpoint.call_one(str(tmp)), self.reward.save_rng.call_one(str(tmp)))
        checkpoint.save_rng(tmp, "controller")
        checkpoint.write_run_state(tmp, self.state)
        (tmp / "config.toml").write_text(dump_toml(self.config))
        checkpoint.commit(run_dir, tmp, self.state.step, keep=self.config.checkpoint.keep)
        return time.perf_counter() - start

    def checkpoint_due(self) -> bool:
        every = self.config.checkpoint.every_steps
        return self.state.step == self.config.run.steps or (every > 0 and self.state.step % every == 0)

    async def shutdown(self) -> None:
        """Stop every actor process and the store; safe after a partial setup."""
        self._shutting_down = True
        actor_processes = monarch_processes()
        if self._actors_ready:
            await asyncio.gather(
                asyncio.wait_for(self.generators.shutdown.call(), 10), self.frozen.stop_engines(), return_exceptions=True
            )
        stopping = asyncio.gather(*(procs.stop() for procs in self._proc_meshes + self.frozen.take_procs()), return_exceptions=True)
        try:
            await asyncio.wait_for(stopping, 8)
        except asyncio.TimeoutError:
            pass  # a mesh stops only once its actors have started (vLLM may still be loading): reaped below
        await asyncio.to_thread(reap, actor_processes, 5)  # a stopped mesh's processes may still be exiting
        self._proc_meshes = []
        self._actors_ready = False
        if self._store_started:
            self._store_started = False
            await weight_sync.shutdown_store()
        if self.run_log is not None:
            self.run_log.close()
        if self._previous_fault_hook is not None:
            monarch.actor.unhandled_fault_hook, self._previous_fault_hook = self._previous_fault_hook, None

    async def generate(self, requests: list[GenerationRequest], sampling: SamplingConfig) -> list[Any]:
        """Send a batch to the next generator replica (round-robin)."""
        replicas = self.config.generator.num_replicas
        replica = self.generators.slice(procs=self._replica % replicas)
        self._replica += 1
        return await replica.generate.call_one(requests, sampling)

    async def rollout_and_score(
        self, rows: list[tuple[str, dict]], group_ids: list[str], group_size: int, sampling: SamplingConfig,
        frozen_samplers: bool = False,
    ) -> list[RolloutGroup]:
        specs = [
            GroupSpec(
                group_id=group_id,
                task_name=task_name,
                task=self.tasks[task_name].task,
                example=row,
                renderer=self.renderers[task_name],
                env_config=self.tasks[task_name].config.env,
            )
            for group_id, (task_name, row) in zip(group_ids, rows, strict=True)
        ]
        samplers = [self.algorithms[spec.task_name].sampler if frozen_samplers else POLICY for spec in specs]
        groups = await collect_groups(
            [spec for spec, sampler in zip(specs, samplers) if sampler == POLICY], group_size,
            lambda requests: self.generate(requests, sampling), run_seed=self.config.run.seed,
        )
        for name in sorted(set(samplers) - {POLICY}):
            frozen = await collect_groups(
                [spec for spec, sampler in zip(specs, samplers) if sampler == name], group_size,
                lambda requests, name=name: self.frozen.generate(name, requests, sampling), run_seed=self.config.run.seed,
            )
            mark_frozen(frozen, name)
            groups += frozen
        return list(await asyncio.gather(*(self.score(group) for group in groups)))

    async def score(self, group: RolloutGroup) -> RolloutGroup:
        try:
            return await self.reward.score_group.call_one(group)
        except Exception as exc:
            for rollout in group.rollouts:
                rollout.status = RolloutStatus.ERROR
                rollout.error = f"reward actor failed: {exc}"
            return group

    async def produce(self) -> None:
        """Fill the buffer batch after batch, never more than the staleness budget ahead of training."""
        run = self.config.run
        batch_index = self.state.step
        rows_done_ahead = set(self.state.rows_done_ahead)  # consumed before a resume: not drawn again
        while True:
            async with self.step_done:
                await self.step_done.wait_for(lambda: self.state.step >= batch_index - run.max_policy_staleness)
            start = time.perf_counter()
            rows, group_ids = [], []
            while len(rows) < run.groups_per_step:
                row_index = self.stream.cursor
                row = self.stream.next()
                if row_index not in rows_done_ahead:
                    rows.append(row)
                    group_ids.append(train_group_id(row_index))
            groups = await self.rollout_and_score(
                rows, group_ids, self.config.algorithm.group_size, self.config.generator.sampling, frozen_samplers=True
            )
            stats = self.generation_stats
            stats.seconds += time.perf_counter() - start
            for group in groups:
                stats.completion_tokens += sum(rollout.num_completion_tokens for rollout in group.rollouts)
                await self.buffer.put(group)
            batch_index += 1

    async def validate(self) -> dict[str, float]:
        """Held-out reward through the same rollout path, one sample per row."""
        if not self.validation_rows:
            return {}
        group_ids = [f"eval/step={self.state.step}/{index}" for index in range(len(self.validation_rows))]
        groups = await self.rollout_and_score(self.validation_rows, group_ids, 1, self.config.generator.eval_sampling)
        self.logger.log_rollouts(self.state.step, "eval", groups)
        return reward_metrics([rollout for group in groups for rollout in group.rollouts], prefix="eval/reward")

    async def train_step(self, groups: list[RolloutGroup]) -> dict[str, float]:
        """Advantages → packed micro-batches → one optimizer step → weights to the generators."""
        trainer_config = self.config.trainer
        all_samples, metrics = await self.samples.build(groups)
        samples = [sample for sample in all_samples if len(sample.input_ids) <= trainer_config.seq_len]
        metrics["rollouts/too_long"] = len(all_samples) - len(samples)
        if not samples:
            metrics["train/skipped"] = 1
            return metrics
        batch = pack_samples(samples, seq_len=trainer_config.seq_len, pad_token_id=self.pad_token_id)  # [R, L]
        micro_batches = split_micro_batches(batch, trainer_config.micro_batch_size)
        with timer("train"):
            train_metrics = await self.trainer.train_step.call_one(micro_batches)
        metrics.update({key if key == "loss" or "/" in key else f"train/{key}": value for key, value in train_metrics.items()})
        if "train/mismatch_k3" in metrics and (warning := self.mismatch_watch.check(metrics["train/mismatch_k3"])):
            tqdm.write(f"rlmesh: warning: {warning}", file=sys.stderr)

        with timer("weight_sync"):
            await self.sync_weights(self.state.policy_version + 1)
        return metrics

    async def sync_weights(self, policy_version: int) -> None:
        """The trainer publishes its weights as `policy_version`; every generator reloads them."""
        await self._within(self.trainer.push_weights.call_one(policy_version), "trainer weight push", policy_version)
        await self._within(self.generators.update_weights.call(policy_version), "generator weight reload", policy_version)
        self.state.policy_version = policy_version

    async def run(self) -> dict[str, Any]:
        """The whole run: start the actors, train, stop them (also on error or Ctrl-C)."""
        self._run_task = asyncio.current_task()
        try:
            await self.setup()
            return await self.train()
        finally:
            await self.shutdown()

    async def train(self) -> dict[str, Any]:
        """Validate, then `run.steps` optimizer steps; returns the first and last validation metrics."""
        config = self.config
        if self.resume_from is not None:
            run_dir = self.resume_from.parent.parent
        else:
            run_dir = fresh_run_dir(config.run_dir)
            (run_dir / "config.toml").write_text(dump_toml(config))
        if self.run_log is not None:
            self.run_log.move_into(run_dir)
        self.logger = MetricsLogger(config, run_dir)
        sample_logger = SampleLogger(
            config,
            {name: task.task.target for name, task in self.tasks.items()},
            reference_logprobs=(lambda ids: self.trainer.logprobs.call_one(ids, reference=True)) if config.algorithm.kl_coef > 0 else None,
        )
        summary: dict[str, Any] = {"run_dir": str(run_dir)}
        producer = asyncio.create_task(self.produce())
        try:
            if config.run.eval_every > 0 and self.state.step == 0:
                summary["eval_start"] = await self.validate()
                self.logger.log_step(0, {"policy_version": 0, **summary["eval_start"]})
            for _ in self.logger.progress(self.state.step, config.run.steps):
                step_start = time.perf_counter()
                groups, evicted = await self._next_batch(producer)
                self.logger.log_rollouts(self.state.step + 1, "train", groups)
                await sample_logger.record(groups, self.state.step + 1)
                metrics = self._rollout_metrics(groups, len(evicted), wait_seconds=time.perf_counter() - step_start)
                metrics.update(await self.train_step(groups))
                actor_states = await gather_states([self.trainer, self.generators, self.reward])
                self.state.mark_rows_done([row_index_of(group.group_id) for group in groups + evicted])
                async with self.step_done:
                    self.state.step += 1
                    self.step_done.notify_all()
                is_last = self.state.step == config.run.steps
                if config.run.eval_every > 0 and (self.state.step % config.run.eval_every == 0 or is_last):
                    eval_metrics = await self.validate()
                    metrics.update(eval_metrics)
                    if is_last:
                        summary["eval_end"] = eval_metrics
                if self.checkpoint_due():
                    metrics["time/checkpoint_s"] = await self.save_checkpoint(run_dir)
                metrics["time/step_s"] = time.perf_counter() - step_start
                self.logger.log_step(self.state.step, {"policy_version": self.state.policy_version, **metrics}, actor_states)
        finally:
            producer.cancel()
            await asyncio.gather(producer, return_exceptions=True)
            self.logger.close()
        return summary

    async def _within(self, call: Any, what: str, policy_version: int) -> Any:
        """Await an actor call, failing loudly instead of hanging when it exceeds `run.weight_sync_timeout_s`."""
        try:
            return await asyncio.wait_for(call, self.config.run.weight_sync_timeout_s)
        except asyncio.TimeoutError:
            raise RuntimeError(
                f"{what} took longer than run.weight_sync_timeout_s={self.config.run.weight_sync_timeout_s} s "
                f"(policy version {policy_version})"
            ) from None

    async def _next_batch(self, producer: asyncio.Task) -> tuple[list[RolloutGroup], list[RolloutGroup]]:
        """The next batch from the buffer; a crashed producer raises here instead of hanging the run."""
        get = asyncio.ensure_future(self.buffer.get(self.config.run.groups_per_step, self.state.policy_version))
        await asyncio.wait([get, producer], return_when=asyncio.FIRST_COMPLETED)
        if not get.done():
            get.cancel()
            producer.result()
        return get.result()

    def _rollout_metrics(self, groups: list[RolloutGroup], evicted: int, wait_seconds: float) -> dict[str, float]:
        stats = self.generation_stats.drain()
        metrics: dict[str, float] = {
            "rollouts/evicted_stale_groups": evicted,
            "rollouts/policy_lag_max": max(
                (self.state.policy_version - group.min_policy_version for group in groups if not is_frozen_sampled(group)), default=0
            ),
            "time/generation_s": stats.seconds,
            "time/wait_for_rollouts_s": wait_seconds,
            "perf/generation_tokens_per_s": stats.completion_tokens / stats.seconds if stats.seconds else 0.0,
        }
        metrics.update(rollout_metrics(groups))
        return metrics
