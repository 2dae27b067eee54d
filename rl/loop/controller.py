"""The Controller owns a run: it reads like the GRPO loop it drives.

                         ┌─────────────────────────────── Controller (this process) ────────────────────────────────┐
    task rows ─▶ RowStream ─▶ Admission ─▶ produce_row ─▶ RolloutBuffer ─▶ train(): SampleBuilder ─▶ pack ─▶ micro-batches
                         └───────────────│──────▲──────────│──▲────────────────────────────────────────────│──────────┘
                              GenerationRequest │ Completion │  │ RolloutGroup (scored)             TensorDict │ ▲ metrics
                                         ▼      │   RolloutGroup▼  │                                          ▼ │
                         Generator ×N (vLLM), frozen models    RewardActor ×M            PolicyTrainer (1 or FSDP2 ranks)
                                         ▲                                                                    │
                                         └──────── weights: shared memory / torchstore, by policy version ◀───┘

    producer:  admitted row → group_size rollouts (generation ⇄ environment) → scoring → buffer
    consumer:  buffer → advantages → packed batch → train step → weight push → generator reload

Admission (`rl.loop.admission`) lets at most `run.max_concurrent_rollouts` rows generate at once and
none more than `run.max_policy_staleness` steps ahead of the policy (0 = synchronous); the buffer evicts
groups that finished too late. The run ends after `run.steps` steps or at the data's end (`run.epochs`,
`run.max_rows`). Actors, processes and failures: `rl.loop.roles.Roles`; what a resume needs: `rl.loop.state.RunState`;
what the loop derives from it: `rl.loop.progress`; a lost trainer replaced in the run: `rl.loop.recovery`; a weight
sync: `rl.loop.weight_update`; the run's directory and logs: `rl.loop.run_files`.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rl.algorithms.samples import SampleBuilder
from rl.checkpoint import store as checkpoint
from rl.checkpoint.run_dir import RunDirLock
from rl.config import Config
from rl.console import say, warn
from rl.loop.admission import Admission
from rl.loop.buffer import RolloutBuffer
from rl.loop.data import RowStream
from rl.loop.progress import progress_at
from rl.loop.recovery import TrainerRecovery
from rl.loop.resolve import resolve_config
from rl.loop.roles import Roles
from rl.loop.run_files import close_run_logs, log_step_rollouts, open_run_logs
from rl.loop.scored_groups import ScoredGroups, built_tasks
from rl.loop.state import Checkpoints, RunState, due_after, row_index_of, train_group_id
from rl.loop.validation import held_out_rows, validate
from rl.loop.weight_update import sync_policy
from rl.metrics import timer
from rl.metrics.generation import GenerationStats, GroupFailures, batch_metrics, failure_line, overlap_metrics
from rl.packing.prefix_tree import pack_for_trainer, packing_metrics
from rl.packing.rows import split_micro_batches
from rl.services.breaker import CircuitBreaker, group_failure
from rollouts.types import RolloutGroup

Trained = tuple[dict[str, Any], list]
"""A trained step's metrics and the actors' metric states."""


class Controller:
    def __init__(self, config: Config, resume_from: Path | None = None, roles_class: Callable[..., Roles] = Roles):
        """`resume_from`: a committed checkpoint directory to continue from (see `rl.checkpoint`); `roles_class`: what
        makes the run's roles (a LoRA tenant's share the tenants' generator and trainer: `rl.loop.tenants`)."""
        self.config = config = resolve_config(config)  # what needs the runtime, checked and decided
        self.resume_from = resume_from
        self.tasks, self.renderers, self.stop_token_ids = built_tasks(config)
        self.pad_token_id = self.stop_token_ids[0]
        self.progress = progress_at(config, self.tasks, resume_from)
        """Run state, row stream, buffer, admission and watches: replaced whole by `rewind`."""
        self.validation_rows = held_out_rows(self.tasks, config.run.eval_groups)
        self.breaker = CircuitBreaker(config.services.breaker, on_open=self.stop_run)
        self.algorithms = config.task_algorithms()
        self.roles = roles_class(config, stop_run=self.stop_run, policy_version=lambda: self.state.policy_version)
        self.samples = SampleBuilder(self.algorithms, self.renderers, self.roles.prompt_logprobs)
        self.scored_groups = ScoredGroups(self.tasks, self.renderers, self.roles, config.run.seed)
        self.group_failures = GroupFailures()
        """Groups produced and failed over the whole run: the end of the run says so when some failed."""
        self.actor_failures: list[str] = []
        """Why the run stopped, if an actor failure or the rollout breaker stopped it (the CLI prints these)."""
        self.checkpoints = Checkpoints(self.state, self.roles, config)
        self.recovery = TrainerRecovery(self)
        self._unlogged: asyncio.Future | None = None  # the step being trained or ended, until its record is logged
        self._run_task: asyncio.Task | None = None
        self.run_lock: RunDirLock | None = None
        """The run directory's lock when this controller took it: a new run's, or a Python-API resume's (`rlmesh train --resume` holds its own)."""

    @property
    def state(self) -> RunState:
        return self.progress.state

    @property
    def stream(self) -> RowStream:
        return self.progress.stream

    @property
    def planned_steps(self) -> int:
        return self.progress.planned_steps

    @property
    def buffer(self) -> RolloutBuffer:
        return self.progress.buffer

    @property
    def admission(self) -> Admission:
        return self.progress.admission

    @property
    def generation_stats(self) -> GenerationStats:
        return self.progress.generation_stats

    @property
    def run_dir(self) -> Path:
        """The run's directory, once the training opened it."""
        return self.logger.run_dir

    def rewind(self, checkpoint_dir: Path) -> None:
        """The loop's progress as of committed checkpoint `checkpoint_dir` (`rl.loop.progress`), as a resume from it
        starts; the step in flight, if any, was dropped before (`drop_step_in_flight`)."""
        self.resume_from = checkpoint_dir
        self.progress = progress_at(self.config, self.tasks, checkpoint_dir)
        self.checkpoints.rewind(self.state)

    async def drop_step_in_flight(self) -> None:
        """Cancel the train step in flight, if any, with its rollouts, metric states and log lines."""
        if self._unlogged is not None:
            self._unlogged.cancel()
            await asyncio.gather(self._unlogged, return_exceptions=True)
            self._unlogged = None

    def stop_run(self, message: str) -> None:
        """Keep `message` for the CLI and cancel the run's task (from any thread)."""
        self.actor_failures.append(message)
        if self._run_task is not None:
            self._run_task.get_loop().call_soon_threadsafe(self._run_task.cancel)

    def _warn(self, warning: str, stop: bool = False) -> None:
        warn(warning)
        if stop:
            self.stop_run(f"{warning}: stopping the run")

    async def run(self) -> dict[str, Any]:
        """The whole run: start the actors, train, stop them (also on error or Ctrl-C)."""
        self._run_task = asyncio.current_task()
        try:
            await self.setup()
            return await self.recovery.train()  # train(), again from the newest checkpoint after a trainer loss
        finally:
            await self.shutdown()
            if self.run_lock is not None:  # kept for a recovery that did not train again
                self.run_lock.release()

    async def setup(self) -> None:
        """Start every role; a resumed run then loads its checkpoint into them and this process."""
        await self.roles.start(self.stop_token_ids, self.planned_steps)
        if self.resume_from is not None:  # the generators get the checkpoint's weights through the normal sync
            say(f"loading checkpoint {self.resume_from}")
            await self.roles.load_checkpoint(self.resume_from)
            checkpoint.load_rng(self.resume_from, "controller")
            await self.sync_weights(self.state.policy_version)

    async def shutdown(self) -> None:
        """Stop every actor process and the store; safe after a partial setup."""
        await self.roles.stop()

    async def train(self) -> dict[str, Any]:
        """Validate, then optimizer steps until `run.steps` or the data's end; returns the first and last validation metrics."""
        run_dir = self._open_run_dir()
        summary: dict[str, Any] = {"run_dir": str(run_dir)}
        producer = asyncio.create_task(self.produce())
        try:
            if self.state.step == 0 and self.config.run.eval_every > 0:
                say(f"validating on {len(self.validation_rows)} held-out rows (step 0)")
                summary["eval_start"] = await self.validate()
                self.logger.log_step(0, {"policy_version": 0, **summary["eval_start"]})
            for _ in self.logger.progress(self.state.step, self.planned_steps):
                step_start = time.perf_counter()
                groups, evicted = await self._next_batch(producer)
                if len(groups) < self.config.run.groups_per_step:  # the data ran out before the planned steps
                    summary["data_exhausted_at_step"] = self.state.step
                    await self._end_step(run_dir, summary, step_start, trained=None)
                    break
                self._unlogged = asyncio.ensure_future(self._step(groups, evicted, time.perf_counter() - step_start))
                await self._end_step(run_dir, summary, step_start, await asyncio.shield(self._unlogged))
                self._unlogged = None
        except asyncio.CancelledError:
            if not self.actor_failures and self.recovery.lost is None:  # the first Ctrl-C
                await self.checkpoints.after_interrupt(run_dir, self._end_step_in_flight(run_dir, summary))
            raise
        finally:
            lock = None if self.recovery.keeps_run_dir(sys.exception()) else self.run_lock  # kept through a recovery
            producer.cancel()
            await asyncio.gather(producer, return_exceptions=True)
            if warning := self.group_failures.summary():
                self._warn(warning)
            close_run_logs(self.logger, lock, self.state.step + 1, self.generation_stats.drain().dropped_failed)
        return summary

    def _open_run_dir(self) -> Path:
        """The run's directory and its loggers (`rl.loop.run_files`)."""
        run_dir, lock, self.logger, self.sample_logger = open_run_logs(
            self.config, self.tasks, self.roles, self.resume_from
        )
        self.run_lock = lock or self.run_lock  # a recovery's training goes on under the lock its run kept
        return run_dir

    async def _step(self, groups: list[RolloutGroup], evicted: list[RolloutGroup], wait_seconds: float) -> Trained:
        """One optimizer step on a consumed batch: its logs, its metrics and the actors' metric states."""
        stats = self.generation_stats.drain()
        metrics = batch_metrics(groups, evicted, stats, self.state.policy_version, wait_seconds)
        train_start = time.perf_counter()
        step_metrics = await self.train_step(groups)
        busy = time.perf_counter() - train_start  # advantages, train step (all minibatches) and weight sync
        await log_step_rollouts(self.logger, self.sample_logger, self.state.step + 1, groups, stats.dropped_failed)
        if line := failure_line(self.state.step + 1, groups + stats.dropped_failed):
            self._warn(line)
        for warning in self.progress.signal_watch.observe(self.state.step + 1, groups):
            self._warn(warning)
        for key in ("rollouts/dropped_groups", "rollouts/dropped_zero_adv_groups"):
            step_metrics[key] += metrics[key]  # the producer's drops and the step's
        metrics |= step_metrics | overlap_metrics(wait_seconds, busy)
        actor_states = await self.roles.gather_states(self.state.step + 1)
        self.state.mark_rows_done([row_index_of(group.group_id) for group in groups + evicted])
        self.state.step += 1
        return metrics, actor_states

    async def _end_step(
        self, run_dir: Path, summary: dict, step_start: float, trained: Trained | None, interrupted: bool = False
    ) -> None:
        """Every step ends here: held-out eval and a checkpoint when due (`rl.loop.state.due_after`), the step's record reduced
        with the actors' states and committed with the checkpoint (a kill before its log line loses nothing), then logged.
        `trained` is None when the data ran out: the run ends with the eval and checkpoint the last step did not do.
        `interrupted`: after a Ctrl-C, no eval and always a checkpoint."""
        step, version = self.state.step, self.state.policy_version
        eval_due, checkpoint_due = due_after(step, self.planned_steps, self.config, data_ran_out=trained is None)
        eval_due, checkpoint_due = eval_due and not interrupted, "full" if interrupted else checkpoint_due
        weights_only = checkpoint_due == "weights"
        metrics, actor_states = trained or ({}, [])
        if eval_due:
            metrics |= (evaluation := await self.validate())
            if trained is None or step == self.planned_steps:
                summary["eval_end"] = evaluation
        if trained is None:  # no step to record
            if metrics:
                self.logger.log_step(step, {"policy_version": version, **metrics})
            if checkpoint_due:
                await self.checkpoints.save(run_dir, weights_only=weights_only)
            return
        if (reduced := self.checkpoints.record_of(step)) is None:  # else a Ctrl-C stopped this step's end in its save
            metrics |= {key: value for service in self.roles.services for key, value in service.metrics().items()}
            reduced = self.logger.reduce_step({"policy_version": version, **metrics}, actor_states)
        record, samples = reduced
        if checkpoint_due:
            record["time/checkpoint_s"] = await self.checkpoints.save(run_dir, (record, samples), weights_only)
        record["time/step_s"] = time.perf_counter() - step_start
        self.logger.write_step(step, record, samples)

    async def _end_step_in_flight(self, run_dir: Path, summary: dict[str, Any]) -> bool:
        """After the first Ctrl-C: a train step in flight finishes (the trainer's weights are already moving) and ends
        with a checkpoint and no eval; False when no step was in flight."""
        if self._unlogged is None:
            return False
        await self._end_step(run_dir, summary, time.perf_counter(), await self._unlogged, interrupted=True)
        return True

    async def _next_batch(self, producer: asyncio.Task) -> tuple[list[RolloutGroup], list[RolloutGroup]]:
        """The next batch from the buffer, in row order (packing and logs replay on resume); a crashed producer raises."""
        groups, evicted = await self.buffer.next_batch(
            self.config.run.groups_per_step, self.state.policy_version, producer
        )
        groups.sort(key=lambda group: row_index_of(group.group_id))
        await self.admission.release_accepted(len(evicted))
        return groups, evicted

    async def produce(self) -> None:
        """Admit rows one by one as the budgets allow; each row's group reaches the buffer when it finishes."""
        rows_done_ahead = set(self.state.rows_done_ahead)  # consumed before a resume: not drawn again
        async with asyncio.TaskGroup() as rows:
            while True:
                await self.admission.acquire()
                row_index, drawn = self.stream.next_not_in(rows_done_ahead)
                if drawn is None:
                    await self.admission.finish(accepted=False)
                    break
                task_name, row = drawn
                rows.create_task(self.produce_row(row_index, task_name, row))
        self.buffer.close()

    async def produce_row(self, row_index: int, task_name: str, row: dict) -> None:
        self.generation_stats.row_started()
        algorithm = self.samples.algorithms[task_name]
        size, sampling = algorithm.rollouts_per_row(self.config.algorithm.group_size), self.config.generator.sampling
        group = await self.scored_groups.make(
            train_group_id(row_index), task_name, row, size, sampling, algorithm.config.sampler, algorithm.rollout_fn()
        )
        failure = group_failure(group)
        self.breaker.record(*failure)
        self.group_failures.record(*failure)
        # the group's advantages are computed here, once; a dropped group gives its slot to another row
        drop = self.samples.drop_reason(group, self.config.trainer.seq_len)
        self.generation_stats.row_finished(group, drop)
        if drop is None:
            await self.buffer.put(group)
        else:
            self.state.mark_rows_done([row_index])
        await self.admission.finish(drop is None)

    async def validate(self) -> dict[str, float]:
        """Held-out reward through the same rollout path, and pass@k (`rl.loop.validation.validate`)."""
        return await validate(self.scored_groups, self.validation_rows, self.state.step, self.config, self.logger)

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
        batch = pack_for_trainer(samples, trainer_config, self.pad_token_id)
        metrics.update(packing_metrics(batch))
        micro_batches = split_micro_batches(batch, trainer_config.micro_batch_size)
        with timer("train"):
            metrics |= await self.roles.train_step(micro_batches)
        if skipped := self.progress.nonfinite_steps.check(
            self.state.step + 1, metrics, trainer_config.ppo_n_minibatches
        ):
            self._warn(*skipped)
            await self.admission.release_accepted(len(groups))  # as for a step with nothing to train
            return metrics  # the weights did not change: no sync, same version
        if "train/mismatch_k3" in metrics and (
            warning := self.progress.mismatch_watch.check(
                metrics["train/mismatch_k3"], self.state.policy_version - min(g.min_policy_version for g in groups)
            )
        ):
            self._warn(warning)
        with timer("weight_sync"):
            metrics |= await self.sync_weights(self.state.policy_version + 1)
        if "train/clip_frac_low" in metrics:
            metrics["train/ppo_clip_frac"] = metrics["train/clip_frac_low"] + metrics["train/clip_frac_high"]
        return metrics

    async def sync_weights(self, policy_version: int, rewind: bool = False) -> dict[str, float]:
        """The trainer's weights to every generator as `policy_version`, then admission moves on (`rl.loop.weight_update`)."""
        return await sync_policy(self.roles, self.state, self.admission, policy_version, rewind)
