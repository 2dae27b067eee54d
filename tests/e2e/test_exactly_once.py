"""Exactly once under a staleness budget: a run at budget 2 with 2 generator replicas, its launcher SIGKILLed
at two random moments and resumed each time (a resumed launch killed again), trains every row exactly once and skips none. The off-policy
loop's own promises are checked on the same run: no trained rollout older than the budget, off-policy rollouts
trained, both replicas used, the wait/overlap ratios consistent with the step's times; and, with two PPO minibatches
a batch, the signals of the off-policy inner loop together: two optimizer steps a batch, the second minibatch's drift
from the step-start policy (`train/ppo_kl` > 0) and clipped tokens (`train/ppo_clip_frac` > 0).

Bitwise equality with an uninterrupted run is the promise at budget 0 only (`tests/unit/rl/checkpoint/test_resume.py`): under a
budget, rollouts in flight at a kill are dropped and their rows drawn again, sampled by the resumed policy.
"""

import os
import random
import signal

import pytest

from rl.checkpoint import store as checkpoint
from tests.support.launch import Launch
from tests.support.runs import assert_rows_trained_once, read_jsonl

STEPS, GROUPS_PER_STEP, GROUP_SIZE = 10, 2, 4
OVERRIDES = [
    "--run.steps",
    str(STEPS),
    "--run.max_policy_staleness",
    "2",
    "--trainer.ppo_n_minibatches",
    "2",
    "--generator.num_replicas",
    "2",
    "--services.reward.replicas",
    "2",
    "--checkpoint.every_steps",
    "1",
    "--run.eval_every",
    "0",
    "--sample_logging.enabled",
    "false",
    "--loss.clip_eps_low",  # a zero-width clip: every drifted token clips in its advantage's direction, so the clip's
    "0.0",  # signal does not depend on how far the random kill moments let the policy drift
    "--loss.clip_eps_high",
    "0.0",
    "--tasks.0.rubric.reward_fns",
    "[{fn = 'tests.support.e2e_rewards:by_sample_index'}]",  # no group is dropped for zero advantage
]


def wait_for_a_new_step(launch: Launch, after: int) -> int:
    """Wait until `launch` logs a step past `after`; returns it."""
    while True:
        launch.wait_for_line(" v")
        line = launch.lines[-1]
        if line.startswith("step ") and int(line.split()[1]) > after:
            return int(line.split()[1])


def test_every_row_is_trained_exactly_once_across_two_kills_at_staleness_budget_2(tmp_path):
    seed = int(os.environ.get("RLMESH_TEST_SEED") or random.randrange(2**32))  # set it to replay a failure
    rng = random.Random(seed)
    print(f"kill moments drawn with seed {seed} (RLMESH_TEST_SEED={seed} replays them)")
    run_dir = tmp_path / "tiny_qwen3_e2e"
    launches = [Launch(tmp_path, *OVERRIDES)]
    resumed_from = 0
    try:
        for _ in range(2):  # a random moment after the launch's first new step: generation, training or a checkpoint
            launch = launches[-1]
            step = wait_for_a_new_step(launch, resumed_from)
            delay = rng.uniform(0.0, 4.0)
            if step < STEPS - 1:  # but no later than the next-to-last step's line: a later kill may find the run ended
                launch.read_until(f"step {STEPS - 1:4d} v", timeout=delay)
            assert launch.process.poll() is None, launch.output()
            launch.process.send_signal(signal.SIGKILL)
            launch.process.wait(timeout=30)
            launch.kill_everything()
            resumed_from = checkpoint.read(checkpoint.newest_checkpoint(run_dir), checkpoint.RUN_STATE)["step"]
            print(f"killed {launch.output()[-200:]!r}; resuming from step {resumed_from}")
            launches.append(Launch(tmp_path, resume=run_dir))
        assert launches[-1].wait_for_exit(timeout=900) == 0, launches[-1].output()
    finally:
        for launch in launches:
            launch.kill_everything()
    assert_rows_trained_once(run_dir, STEPS, GROUPS_PER_STEP, GROUP_SIZE)
    newest = checkpoint.newest_checkpoint(run_dir)
    assert {path.name for path in (newest / "rng").iterdir()} == {
        "controller.pt",
        "trainer.pt",
        "reward_0.pt",
        "reward_1.pt",
    }
    assert checkpoint.damage(newest) is None
    committed_metrics, _ = checkpoint.read(newest, checkpoint.STEP_RECORD)
    logged = next(record for record in read_jsonl(run_dir / "metrics.jsonl") if record["step"] == STEPS)
    assert {"step": STEPS, **committed_metrics} == {
        key: value for key, value in logged.items() if key not in ("time/step_s", "time/checkpoint_s")
    }
    served = [
        sum(value for key, value in record.items() if key.startswith("services/generator/replica_"))
        for record in read_jsonl(run_dir / "metrics.jsonl")
        if record["step"] > 0
    ]
    assert served == sorted(served)  # the services' counters continue across the resumes, never from 0 again
    assert_off_policy_loop(run_dir, budget=2)
    assert_two_minibatches_a_batch(run_dir)


def assert_off_policy_loop(run_dir, budget: int) -> None:
    """Every trained rollout was sampled at most `budget` versions before the step that trained it, some off-policy;
    both generator replicas served; each step's wait and overlap ratios agree with its own times."""
    steps = [record for record in read_jsonl(run_dir / "metrics.jsonl") if record["step"] > 0]
    assert max(record["async/version_offset_max"] for record in steps) >= 1
    for record in steps:
        wait, ratio = record["perf/sample_wait_time"], record["perf/wait_time_ratio"]
        assert 0.0 <= ratio <= 1.0 and record["perf/overlap_ratio"] == pytest.approx(1 - ratio)
        busy_at_least = record["time/train_s"] + record["time/weight_sync_s"]  # the batch is built in the busy time too
        assert ratio <= wait / (wait + busy_at_least) + 1e-6
    train = [record for record in read_jsonl(run_dir / "rollouts.jsonl") if record["kind"] == "train"]
    for record in train:
        trained_at = record["step"] - 1  # the step that makes version s trains the policy at version s - 1
        sampled_at = min(turn["policy_version"] for turn in record["rollout"]["turns"])
        assert 0 <= trained_at - sampled_at <= budget
    assert {record["rollout"]["metadata"]["generator_replica"] for record in train} == {0, 1}


def assert_two_minibatches_a_batch(run_dir) -> None:
    """Every step took two optimizer steps (the LR schedule counts both), the second drifted from the step-start
    snapshot (k3 `train/ppo_kl` > 0: 0 would mean the minibatches did not update in turn), and some tokens were
    clipped in the run (the clip, zero-wide here, engages only on a drifted policy)."""
    steps = [record for record in read_jsonl(run_dir / "metrics.jsonl") if record["step"] > 0]
    assert [record["train/optimizer_steps"] for record in steps] == [2] * STEPS
    assert [record["train/optimizer_steps_total"] for record in steps] == [2 * record["step"] for record in steps]
    assert all(record["train/ppo_kl"] > 0 for record in steps), [record["train/ppo_kl"] for record in steps]
    assert max(record["train/ppo_clip_frac"] for record in steps) > 0
