"""The loop's resumable state in one object, built by one function for a new run, a resume and a trainer recovery.

A checkpoint saves only the run state (`rl.loop.state.RunState`); everything else the loop carries from step to step
is derived from it here: the row stream at the data cursor, an empty rollout buffer, admission at the policy version,
and fresh per-step watches. `Controller.__init__` and `Controller.rewind` both call `progress_at`, so "what a resume
rebuilds" is written once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rl.checkpoint import store as checkpoint
from rl.config import Config
from rl.loop.admission import Admission
from rl.loop.buffer import RolloutBuffer
from rl.loop.data import RowStream, training_stream
from rl.loop.state import RunState
from rl.metrics.generation import GenerationStats
from rl.metrics.signal import SignalWatch
from rl.precision import MismatchWatch, NonfiniteSteps
from tasks.build import BuiltTask


@dataclass
class LoopProgress:
    """Where the loop stands: what a checkpoint saves (`state`) and what is derived from it."""

    state: RunState
    stream: RowStream
    """The training rows still to draw, from `state.data_cursor` on."""
    planned_steps: int
    """Optimizer steps the LR schedule is sized for; fewer happen if dropped groups use up the data."""
    buffer: RolloutBuffer
    admission: Admission
    nonfinite_steps: NonfiniteSteps
    generation_stats: GenerationStats
    mismatch_watch: MismatchWatch
    signal_watch: SignalWatch


def progress_at(config: Config, tasks: dict[str, BuiltTask], checkpoint_dir: Path | None) -> LoopProgress:
    """The loop's progress as of committed checkpoint `checkpoint_dir` (None: a new run's, at step 0)."""
    state = RunState(**checkpoint.read(checkpoint_dir, checkpoint.RUN_STATE)) if checkpoint_dir else RunState()
    stream, planned_steps = training_stream(tasks, config.run, cursor=state.data_cursor)
    return LoopProgress(
        state=state,
        stream=stream,
        planned_steps=planned_steps,
        buffer=RolloutBuffer(max_staleness=config.run.max_policy_staleness),
        admission=Admission.for_run(config.run, state.policy_version),
        nonfinite_steps=NonfiniteSteps(config.trainer.max_nonfinite_steps),
        generation_stats=GenerationStats(),
        mismatch_watch=MismatchWatch(config.run.mismatch_warn_factor, config.run.mismatch_warn_floor),
        signal_watch=SignalWatch(config.run.no_signal_warn_steps),
    )
