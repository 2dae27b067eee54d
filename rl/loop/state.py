"""A run's progress: what a checkpoint saves (`RunState`), when it is saved and what the roles put in it, how rows name
their groups. The run on disk (directory, checkpoints, resume) is `rl.checkpoint`'s."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl.checkpoint import store as checkpoint
from rl.config import Config, dump_toml
from rl.loop.roles import Roles


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


def due_after(step: int, planned_steps: int, config: Config, data_ran_out: bool) -> tuple[bool, str | None]:
    """(eval due, checkpoint due: None, "full" or "weights") once `step` steps are done: held-out eval every
    `run.eval_every` steps and after the last step; a full checkpoint every `checkpoint.every_steps`, and after the last
    step the one `checkpoint.final` asks for unless a regular one falls there. When the data ran out before the planned
    steps, the run ends with whichever of the two the last step did not just do."""
    eval_every, checkpoint_every = config.run.eval_every, config.checkpoint.every_steps
    regular_eval = eval_every > 0 and step % eval_every == 0
    regular_checkpoint = checkpoint_every > 0 and step % checkpoint_every == 0
    final = None if config.checkpoint.final == "none" else config.checkpoint.final
    if data_ran_out:
        return eval_every > 0 and not regular_eval, final if step > 0 and not regular_checkpoint else None
    last = step == planned_steps
    return regular_eval or (eval_every > 0 and last), "full" if regular_checkpoint else final if last else None


async def save_checkpoint(
    run_dir: Path,
    state: RunState,
    roles: Roles,
    config: Config,
    record: tuple[dict[str, Any], dict[str, Any]] | None = None,
    weights_only: bool = False,
) -> float:
    """Commit a checkpoint of step `state.step`: the roles' part, the step's reduced `record` (metrics, samples) when it
    has one, this process's RNG, the run state and the config (`rl.checkpoint`); `weights_only`: no optimizer state,
    marked not resumable. Returns seconds spent."""
    start = time.perf_counter()
    tmp = checkpoint.begin(run_dir, state.step)
    await roles.save_checkpoint(tmp, weights_only)
    if weights_only:
        checkpoint.write(tmp, checkpoint.WEIGHTS_ONLY)
    if record is not None:
        checkpoint.write(tmp, checkpoint.STEP_RECORD, *record)
    checkpoint.write(tmp, checkpoint.RNG, "controller")
    checkpoint.write(tmp, checkpoint.RUN_STATE, state)
    checkpoint.write(tmp, checkpoint.CONFIG, dump_toml(config))
    # hashing and fsyncing every file takes minutes at 8B with AdamW: off the event loop, so pings and generation go on
    commit = asyncio.ensure_future(
        asyncio.to_thread(checkpoint.commit, run_dir, tmp, state.step, keep=config.checkpoint.keep)
    )
    try:
        await asyncio.shield(commit)
    except asyncio.CancelledError:  # a thread cannot be stopped: this save ends when its commit does, never beside it
        await asyncio.wait([commit])
        raise
    return time.perf_counter() - start


@dataclass
class InterruptReport:
    """What the first Ctrl-C's checkpoint came to, at run step `step`: `error`, why it could not be saved (None: saved,
    or nothing trained). What is saved is read from the run directory when the report is printed (a commit the budget
    gave up on may still complete); `writing`, a commit still under way then, is named."""

    run_dir: Path
    step: int
    error: str | None = None
    writing: Callable[[], int | None] = lambda: None
    """The step of a checkpoint commit still under way, or None."""

    @property
    def checkpoint(self) -> Path | None:
        """The newest committed checkpoint a resume can continue from (not weights only), or None."""
        resumable = [
            path for path in checkpoint.committed_checkpoints(self.run_dir) if not checkpoint.is_weights_only(path)
        ]
        return resumable[-1] if resumable else None

    def message(self) -> str:
        """The console's lines: where the run is and the exact resume command, or how many steps were lost."""
        resume = f"resume with: .venv/bin/rlmesh train --resume {self.run_dir}"
        saved = self.checkpoint
        saved_step = checkpoint.read(saved, checkpoint.RUN_STATE)["step"] if saved is not None else 0
        if saved is not None and saved_step >= self.step:
            return f"rlmesh: interrupted after step {self.step}; it is saved in {saved}\n{resume}"
        if self.error is None and self.step == 0:
            return "rlmesh: interrupted before the first step; nothing was trained and there is nothing to resume"
        kept = f"step {saved_step} is saved; {resume}" if saved is not None else "nothing is saved"
        if (step := self.writing()) is not None:
            kept += f" (the commit of step {step} was still being written: if it completes, a resume continues from it)"
        return (
            f"rlmesh: interrupted after step {self.step}; its checkpoint could not be saved ({self.error}): "
            f"{self.step - saved_step} step(s) lost, {kept}. Keep progress with --checkpoint.every_steps N or a larger "
            "--checkpoint.interrupt_save_s"
        )


@dataclass
class _Save:
    """A checkpoint save of step `step` under way or done, in a task of its own, with the step record it commits."""

    step: int
    weights_only: bool
    record: tuple[dict[str, Any], dict[str, Any]] | None
    task: asyncio.Task[float]

    def usable(self) -> bool:
        return not self.task.done() or (not self.task.cancelled() and self.task.exception() is None)


class Checkpoints:
    """A run's checkpoint commits (`save_checkpoint`) and the newest committed step; after the first Ctrl-C of
    `rlmesh train` (`save_on_interrupt`), the bounded commit of the last completed step and its `report`."""

    def __init__(self, state: RunState, roles: Roles, config: Config):
        self.state, self.roles, self.config = state, roles, config
        self.committed_step = state.step  # a resumed run starts from a committed checkpoint of its step
        self.save_on_interrupt = False
        """Set by `rlmesh train`: a cancelled run (the first Ctrl-C) commits its last completed step before it stops."""
        self.report: InterruptReport | None = None
        """What the Ctrl-C checkpoint came to (the CLI prints it with the resume command)."""
        self.on_save: Callable[[float], None] = lambda budget_s: None
        """Called with the save's budget as it starts (the CLI pushes its hard stop past the save and the teardown)."""
        self._save: _Save | None = None  # the newest save, under way or done

    async def save(
        self, run_dir: Path, record: tuple[dict[str, Any], dict[str, Any]] | None = None, weights_only: bool = False
    ) -> float:
        """`save_checkpoint` of the current step, once; returns seconds spent. It runs in a task of its own that goes on
        when the caller is cancelled (its commit thread cannot be stopped): a second save of the step (the Ctrl-C's,
        after it cancelled the step's end) awaits that one instead of writing the step again, and a save of another
        step waits for it first, so two commits never overlap. `committed_step` counts resumable ones only."""
        step, under_way = self.state.step, self._save
        if (
            under_way is not None
            and under_way.usable()
            and under_way.step == step
            and weights_only >= under_way.weights_only
        ):
            return await asyncio.shield(under_way.task)
        await self.settled()
        task = asyncio.ensure_future(self._commit(run_dir, record, weights_only))
        task.add_done_callback(lambda done: done.cancelled() or done.exception())  # a failure is its caller's to raise
        self._save = _Save(step, weights_only, record, task)
        return await asyncio.shield(self._save.task)

    async def _commit(
        self, run_dir: Path, record: tuple[dict[str, Any], dict[str, Any]] | None, weights_only: bool
    ) -> float:
        step = self.state.step
        seconds = await save_checkpoint(run_dir, self.state, self.roles, self.config, record, weights_only)
        if not weights_only:
            self.committed_step = step
        return seconds

    def record_of(self, step: int) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """The step record a save of `step` under way or done commits (a Ctrl-C cancelled the step's end during it):
        the step is logged with that record, not reduced again (reducing drains what was recorded)."""
        under_way = self._save
        if under_way is not None and under_way.usable() and under_way.step == step:
            return under_way.record
        return None

    def writing(self) -> int | None:
        """The step of a save still under way, or None."""
        return self._save.step if self._save is not None and not self._save.task.done() else None

    async def settled(self, stop: bool = False) -> None:
        """Wait until no save is under way (a trainer recovery reads and renames checkpoints: never beside a commit);
        `stop`: cancel it first (it still ends only once its commit thread has)."""
        if self._save is not None and not self._save.task.done():
            if stop:
                self._save.task.cancel()
            await asyncio.wait([self._save.task])

    def rewind(self, state: RunState) -> None:
        """Continue from committed `state` (a trainer recovery): its steps are saved, later saves are forgotten."""
        self.state, self.committed_step, self._save = state, state.step, None

    async def after_interrupt(self, run_dir: Path, end_step_in_flight: Coroutine[Any, Any, bool]) -> None:
        """Within `checkpoint.interrupt_save_s`: `end_step_in_flight` (a train step in flight finishes and ends with a
        checkpoint, adopting its save if one is under way; False when none was in flight), else a commit of the last
        completed step unless it already is."""
        budget_s = self.config.checkpoint.interrupt_save_s
        if not self.save_on_interrupt:
            end_step_in_flight.close()  # never started: no "never awaited" warning
            return

        async def saving() -> None:
            if not await end_step_in_flight and self.state.step > self.committed_step:
                await self.save(run_dir)

        report = InterruptReport(run_dir, self.state.step, writing=self.writing)
        self.on_save(budget_s)
        try:
            if budget_s <= 0:
                raise TimeoutError("checkpoint.interrupt_save_s = 0")
            await asyncio.wait_for(saving(), budget_s)
        except TimeoutError as exc:
            report.error = str(exc) or f"took longer than checkpoint.interrupt_save_s = {budget_s:g} s"
        except asyncio.CancelledError:
            report.error = "the run was stopped again before it committed"
            raise
        except Exception as exc:
            report.error = repr(exc)
        finally:
            if budget_s <= 0:
                end_step_in_flight.close()
            report.step = self.state.step
            self.report = report  # also when cancelled: the CLI says where the run stands, never "nothing was trained"
