"""A run's progress and its directory: what a checkpoint saves (`RunState`), when and how it is saved, how rows name their groups."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rl.checkpoint import store as checkpoint
from rl.checkpoint.resume import take_over
from rl.checkpoint.run_dir import RunDirLock, claim_fresh, held_here
from rl.config import Config, dump_toml
from rl.loop.roles import Roles


def open_run_dir(run_dir: Path, config_toml: str, resume_from: Path | None) -> tuple[Path, RunDirLock | None]:
    """A resumed run's own directory (`RUN_DIR/checkpoints/step_N` → `RUN_DIR`), else a fresh one claimed
    (`rl.checkpoint.run_dir`) holding the resolved config; and the lock this call took. `rlmesh train --resume` takes over the
    directory before the roles start; a resume through the Python API (`Controller(config, resume_from=...)`) does here."""
    if resume_from is not None:
        resumed = resume_from.parent.parent
        return resumed, None if held_here(resumed) else take_over(resumed, resume_from)
    run_dir, lock = claim_fresh(run_dir)
    (run_dir / "config.toml").write_text(config_toml)
    return run_dir, lock


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


def due_after(step: int, planned_steps: int, config: Config, data_ran_out: bool) -> tuple[bool, bool]:
    """(eval due, checkpoint due) once `step` steps are done: held-out eval every `run.eval_every` steps and a checkpoint
    every `checkpoint.every_steps`, both after the last step; when the data ran out before the planned steps, the run
    ends with whichever of the two the last step did not just do."""
    eval_every, checkpoint_every = config.run.eval_every, config.checkpoint.every_steps
    regular_eval = eval_every > 0 and step % eval_every == 0
    regular_checkpoint = checkpoint_every > 0 and step % checkpoint_every == 0
    if data_ran_out:
        return eval_every > 0 and not regular_eval, step > 0 and not regular_checkpoint
    last = step == planned_steps
    return regular_eval or (eval_every > 0 and last), regular_checkpoint or last


async def save_checkpoint(
    run_dir: Path,
    state: RunState,
    roles: Roles,
    config: Config,
    record: tuple[dict[str, Any], dict[str, Any]] | None = None,
) -> float:
    """Commit a checkpoint of step `state.step`: the roles' part, the step's reduced `record` (metrics, samples) when it
    has one, this process's RNG, the run state and the config (`rl.checkpoint`); returns seconds spent."""
    start = time.perf_counter()
    tmp = checkpoint.begin(run_dir, state.step)
    await roles.save_checkpoint(tmp)
    if record is not None:
        checkpoint.write_step_record(tmp, *record)
    checkpoint.save_rng(tmp, "controller")
    checkpoint.write_run_state(tmp, state)
    (tmp / "config.toml").write_text(dump_toml(config))
    checkpoint.commit(run_dir, tmp, state.step, keep=config.checkpoint.keep)
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
        resume = f"resume with: rlmesh train --resume {self.run_dir}"
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


class InterruptCheckpoint:
    """The newest committed step, and the bounded save of the last completed step after the first Ctrl-C."""

    def __init__(self, state: RunState, budget_s: float):
        """`state`: the run's (its step is read when the save ends); `budget_s`: `checkpoint.interrupt_save_s`."""
        self.state = state
        self.committed_step = state.step  # a resumed run starts from a committed checkpoint of its step
        self.budget_s = budget_s

    async def save(self, run_dir: Path, saving: Awaitable[Path | None]) -> InterruptReport:
        """Await `saving` (the checkpoint it committed, None when there was nothing to save) within the budget."""
        try:
            if self.budget_s <= 0:
                raise TimeoutError("checkpoint.interrupt_save_s = 0")
            path = await asyncio.wait_for(saving, self.budget_s)
        except TimeoutError as exc:
            why = str(exc) or f"took longer than checkpoint.interrupt_save_s = {self.budget_s:g} s"
            return InterruptReport(run_dir, self.state.step, error=why, committed_step=self.committed_step)
        except Exception as exc:
            return InterruptReport(run_dir, self.state.step, error=repr(exc), committed_step=self.committed_step)
        finally:
            if asyncio.iscoroutine(saving):
                saving.close()  # never started (a zero budget): no "never awaited" warning
        return InterruptReport(run_dir, self.state.step, checkpoint=path, committed_step=self.committed_step)
