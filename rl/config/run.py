"""The run's length, seeds, evaluation and output directory, and its checkpoints."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rl.config.section import Section


class RunConfig(Section):
    name: str = "run"
    """Name of the run: its directory is `output_dir/name`."""
    output_dir: str = "runs"
    """The run directory is `output_dir/name`."""
    seed: int = 0
    """Seed of the run: the order of the training rows, every request's sampling seed (with the rollout id and turn)
    and the sample-log draws."""
    steps: int = Field(10, ge=0)
    """Optimizer steps to train; the run ends earlier when `epochs` or `max_rows` is reached."""
    groups_per_step: int = Field(8, ge=1)
    """Rollout groups (task rows) per optimizer step."""
    max_policy_staleness: int = Field(0, ge=0)
    """Most optimizer steps a group's oldest token may lag the trained policy. 0 = synchronous."""
    eval_every: int = Field(0, ge=0)
    """Validate on the held-out split every N steps (and at step 0 and at the end); 0 = never."""
    eval_groups: int | None = Field(None, ge=1)
    """Held-out rows per validation (None = the whole split)."""
    eval_samples_per_row: int = Field(1, ge=1)
    """Samples drawn per held-out row at `generator.eval_sampling`. 1 (the default, with greedy eval sampling): one
    answer per row. k > 1 (needs a temperature above 0): also the unbiased `eval/pass@1` and `eval/pass@<k>`
    (Chen et al. 2021) per task and overall; `eval/reward/mean` is then the mean over all k samples (failed samples
    are left out of both and counted in `eval/failed`)."""
    eval_pass_threshold: float = 1.0
    """A held-out sample passes (for `eval/pass@<k>`) when its reward is at least this."""
    log_rollouts: bool = True
    """Write every rollout, token-exact, to `rollouts.jsonl`."""
    weight_sync_timeout_s: float = Field(600.0, gt=0)
    """Longest a weight push or reload may take before the run stops with an error naming it."""
    metrics_timeout_s: float = Field(300.0, gt=0)
    """Deadline of gathering the trainer's and reward replicas' metric states at the end of a step: a trainer that
    misses it stops the run (resume from the last checkpoint); a reward replica that misses it is left out of that step."""
    max_trainer_recoveries: int = Field(2, ge=0)
    """Times a run restarts a lost trainer (a rank's process died, or a trainer call missed its deadline) in place: a
    new trainer mesh loads the newest checkpoint and the steps since are trained again (`rl.loop.recovery`). One more
    loss stops the run; 0 = every trainer loss stops it. Needs a committed checkpoint (`checkpoint.every_steps`)."""
    reward_concurrency: int = Field(32, ge=1)
    """Most groups the RewardActor scores at once."""
    mismatch_warn_factor: float = Field(5.0, gt=1)
    """Warn when `train/mismatch_k3` exceeds this many times its first-step value (and `mismatch_warn_floor`)."""
    mismatch_warn_floor: float = Field(1e-3, ge=0)
    """The mismatch warning's absolute floor, so that an exactly on-policy run (mismatch ~1e-9) does not warn on
    noise."""
    no_signal_warn_steps: int = Field(5, ge=0)
    """Warn when, for this many consecutive steps, every trained group of a task had equal rewards (group-relative
    advantages all zero: nothing is learned from it; commonly a reward that never fires); 0 = never."""
    max_concurrent_rollouts: int = Field(64, ge=1)
    """Most rows (each a whole group) generating at once."""
    max_concurrent_scoring: int = Field(16, ge=1)
    """Most sequences a teacher scores at once (opd, opsd: their per-token logprobs), so a step's scoring does not
    flood the teacher's replicas; the seconds it takes are `time/scoring_s`."""
    epochs: float | None = Field(None, gt=0)
    """End after this many passes over the training rows (all tasks together); None = no data limit."""
    max_rows: int | None = Field(None, ge=1)
    """End after this many training rows; with `epochs`, the smaller limit wins."""


class CheckpointConfig(Section):
    every_steps: int = Field(0, ge=0)
    """Write a checkpoint every N optimizer steps; 0 = only the final one (always written when a run ends)."""
    final: Literal["full", "weights", "none"] = "full"
    """The checkpoint a run ends with (after its last step, or when its data runs out): "full" (model, AdamW state, RNG:
    resumable with `rlmesh train --resume`; about 3x the fp32 weights), "weights" (the model alone: `rlmesh export` and
    `rlmesh eval` read it, a resume cannot) or "none" (regular `every_steps` checkpoints and Ctrl-C's are still
    written). The start-up line states the choice and its estimated size."""
    keep: int = Field(1, ge=1)
    """Newest committed checkpoints kept; older ones are deleted after each commit. One by default: a full checkpoint
    is about 3x the fp32 weights (1.7 GB at 135M, ~80 GB at 7B) and a commit is atomic (written aside, fsynced,
    hashed, renamed), so the newest is whole and the only one a resume needs. 2 keeps a fallback for a checkpoint
    damaged after its commit, and a resumable one behind a `final = "weights"` checkpoint."""
    interrupt_save_s: float = Field(40.0, ge=0)
    """On the first Ctrl-C (or SIGTERM) of `rlmesh train`, the run commits a checkpoint of its last completed step
    within this many seconds (a train step in flight finishes first); 0 saves nothing. A second Ctrl-C stops at once."""
