"""A run's progress and its directory: what a checkpoint saves (`RunState`) and how rows name their groups."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rl.run_dir import RunDirLock, claim_fresh


def open_run_dir(run_dir: Path, config_toml: str, resume_from: Path | None) -> tuple[Path, RunDirLock | None]:
    """A resumed run's own directory (`RUN_DIR/checkpoints/step_N` → `RUN_DIR`, locked by the launcher before it
    repaired the logs), else a fresh one claimed and locked (`rl.run_dir`), holding the resolved config; and its lock."""
    if resume_from is not None:
        return resume_from.parent.parent, None
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
