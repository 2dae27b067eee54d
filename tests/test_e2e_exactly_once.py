"""Exactly once under a staleness budget: a run at budget 2 with 2 generator replicas, its launcher SIGKILLed
at three random moments and resumed each time, trains every row exactly once and skips none.

Bitwise equality with an uninterrupted run is the promise at budget 0 only (`tests/test_resume.py`): under a
budget, rollouts in flight at a kill are dropped and their rows drawn again, sampled by the resumed policy.
"""

import json
import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from rl import checkpoint
from rl.loop.state import row_index_of
from tests.test_interrupt import Launch

pytestmark = pytest.mark.e2e

STEPS, GROUPS_PER_STEP, GROUP_SIZE = 12, 2, 4
OVERRIDES = [
    "--run.steps", str(STEPS), "--run.max_policy_staleness", "2", "--generator.num_replicas", "2", "--services.reward.replicas", "2",
    "--checkpoint.every_steps", "1", "--run.eval_every", "0", "--sample_logging.enabled", "false",
    "--tasks.0.rubric.reward_fns", "[{fn = 'tests.e2e_rewards:by_sample_index'}]",  # no group is dropped for zero advantage
]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_rows_trained_once(run_dir: Path, steps: int, groups_per_step: int, group_size: int) -> None:
    """From rollouts.jsonl and the data cursor: each row's group trained in exactly one step, every rollout once,
    and every row the cursor has passed trained or evicted as stale (counted in metrics.jsonl), none skipped."""
    train = [record for record in read_jsonl(run_dir / "rollouts.jsonl") if record["kind"] == "train"]
    ids = [record["rollout"]["rollout_id"] for record in train]
    assert len(ids) == len(set(ids)) == steps * groups_per_step * group_size
    steps_of_row: dict[int, set[int]] = {}
    for record in train:
        steps_of_row.setdefault(row_index_of(record["rollout"]["group_id"]), set()).add(record["step"])
    assert all(len(row_steps) == 1 for row_steps in steps_of_row.values()), steps_of_row
    assert Counter(step for row_steps in steps_of_row.values() for step in row_steps) == {step: groups_per_step for step in range(1, steps + 1)}
    state = checkpoint.read_run_state(checkpoint.newest_checkpoint(run_dir))
    assert state["step"] == steps
    consumed = set(range(state["data_cursor"])) | set(state["rows_done_ahead"])
    metrics = [record for record in read_jsonl(run_dir / "metrics.jsonl") if record["step"] > 0]
    assert [record["step"] for record in metrics] == list(range(1, steps + 1))  # no step's record lost
    assert sum(record["rollouts/dropped_groups"] for record in metrics) == 0
    evicted = sum(record["rollouts/evicted_stale_groups"] for record in metrics)
    assert set(steps_of_row) <= consumed and len(consumed) - len(steps_of_row) == evicted


def wait_for_a_new_step(launch: Launch, after: int) -> int:
    """Wait until `launch` logs a step past `after`; returns it."""
    while True:
        launch.wait_for_line(" v")
        line = launch.lines[-1]
        if line.startswith("step ") and int(line.split()[1]) > after:
            return int(line.split()[1])


def test_every_row_is_trained_exactly_once_across_three_kills_at_staleness_budget_2(tmp_path):
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    print(f"kill moments drawn with seed {seed}")
    run_dir = tmp_path / "tiny_qwen3_e2e"
    launches = [Launch(tmp_path, *OVERRIDES)]
    resumed_from = 0
    try:
        for _ in range(3):  # a random moment after the launch's first new step: generation, training or a checkpoint
            launch = launches[-1]
            wait_for_a_new_step(launch, resumed_from)
            time.sleep(rng.uniform(0.0, 4.0))
            assert launch.process.poll() is None, launch.output()
            launch.process.send_signal(signal.SIGKILL)
            launch.process.wait(timeout=30)
            launch.kill_everything()
            resumed_from = checkpoint.read_run_state(checkpoint.newest_checkpoint(run_dir))["step"]
            print(f"killed {launch.output()[-200:]!r}; resuming from step {resumed_from}")
            launches.append(Launch(tmp_path, resume=run_dir))
        assert launches[-1].wait_for_exit(timeout=900) == 0, launches[-1].output()
    finally:
        for launch in launches:
            launch.kill_everything()
    assert_rows_trained_once(run_dir, STEPS, GROUPS_PER_STEP, GROUP_SIZE)
    newest = checkpoint.newest_checkpoint(run_dir)
    assert {path.name for path in (newest / "rng").iterdir()} == {"controller.pt", "trainer.pt", "reward_0.pt", "reward_1.pt"}
    assert checkpoint.damage(newest) is None
    committed_metrics, _ = checkpoint.read_step_record(newest)
    logged = next(record for record in read_jsonl(run_dir / "metrics.jsonl") if record["step"] == STEPS)
    assert {"step": STEPS, **committed_metrics} == {key: value for key, value in logged.items() if key not in ("time/step_s", "time/checkpoint_s")}
    served = [sum(value for key, value in record.items() if key.startswith("services/generator/replica_"))
              for record in read_jsonl(run_dir / "metrics.jsonl") if record["step"] > 0]
    assert served == sorted(served)  # the services' counters continue across the resumes, never from 0 again
