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
    await asyncio.to_thread(checkpoint.commit, run_dir, tmp, state.step, keep=config.checkpoint.keep)
    return time.perf_counter() - start


@dataclass
class InterruptReport:
    """What the first Ctrl-C's checkpoint came to, at run step `step`: `checkpoint`, the committed checkpoint holding it
    (None: nothing trained and none to resume), or `error`, why it could not be saved, and `committed_step`, the newest
    step that is saved (the steps after it are lost)."""

    run_dir: Path
    step: int
    checkpoint: Path | None = None
    error: str | None = None
    committed_step: int = 0

    def message(self) -> str:
        """The console's lines: where the run is and the exact resume command, or how many steps were lost."""
        resume = f"resume with: .venv/bin/rlmesh train --resume {self.run_dir}"
        if self.error is None and self.checkpoint is not None:
            return f"rlmesh: interrupted after step {self.step}; it is saved in {self.checkpoint}\n{resume}"
        if self.error is None:
            return "rlmesh: interrupted before the first step; nothing was trained and there is nothing to resume"
        lost = self.step - self.committed_step
        kept = f"step {self.committed_step} is saved; {resume}" if self.committed_step else "nothing is saved"
        return (
            f"rlmesh: interrupted after step {self.step}; its checkpoint could not be saved ({self.error}): {lost} "
            f"step(s) lost, {kept}. Keep progress with --checkpoint.every_steps N or a larger "
            "--checkpoint.interrupt_save_s"
        )


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

    async def save(
        self, run_dir: Path, record: tuple[dict[str, Any], dict[str, Any]] | None = None, weights_only: bool = False
    ) -> float:
        """`save_checkpoint` of the current step; returns seconds spent. `committed_step` counts resumable ones only."""
        seconds = await save_checkpoint(run_dir, self.state, self.roles, self.config, record, weights_only)
        if not weights_only:
            self.committed_step = self.state.step
        return seconds

    async def after_interrupt(self, run_dir: Path, end_step_in_flight: Coroutine[Any, Any, bool]) -> None:
        """Within `checkpoint.interrupt_save_s`: `end_step_in_flight` (a train step in flight finishes and ends with a
        checkpoint; False when none was in flight), else a commit of the last completed step unless it already is."""
        budget_s = self.config.checkpoint.interrupt_save_s
        if not self.save_on_interrupt:
            end_step_in_flight.close()  # never started: no "never awaited" warning
            return

        async def saving() -> None:
            if not await end_step_in_flight and self.state.step > self.committed_step:
                await self.save(run_dir)

        report = InterruptReport(run_dir, self.state.step, committed_step=self.committed_step)
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
            report.step, report.committed_step = self.state.step, self.committed_step
            if report.error is None and self.committed_step:
                report.checkpoint = checkpoint.committed_checkpoints(run_dir)[-1]
            self.report = report  # also when cancelled: the CLI says where the run stands, never "nothing was trained"
