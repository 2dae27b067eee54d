"""Chaos: a 24-step run of the tiny model while a helper SIGKILLs a generator replica, a reward replica, a
frozen-model (judge) replica and, twice, the trainer at random moments. The run completes with exit 0, each row is
trained once and every step logged once, every rollout was scored (no error), each service counts its restart and its
replacement serves (a generator replaced while the trainer is recovered too: it loads the recovered version), the
trainer is recovered in the run each time (its policy versions go on increasing; the generators sample the trainer's own
weights again: each step's rollouts from the version before it, `train/mismatch_k3` ~0), and no process outlives the
run. (`weight_sync/attested` is not checked: a generator killed during a sync leaves that step's at 0.)

Processes are found by their names (`rl.processes.titles`: `generator/0#0`, `trainer/0`, ...) among the launcher's
children. The seconds from each replica's loss to its replacement serving (the services' "serving again" lines) and
what the trainer was doing when it was killed (the recovery's "trainer lost" lines) are printed (`pytest -s`).
"""

import json
import os
import random
import re
import signal
import time

import psutil

from tests.support.e2e_rewards import HOLD_FROM_VERSION_ENV, HOLD_WHILE_ENV
from tests.support.launch import Launch, processes_with_marker, replica_pid, trainer_pids
from tests.support.runs import assert_rows_trained_once, read_jsonl

STEPS, GROUPS_PER_STEP, GROUP_SIZE = 24, 2, 4
LAST_KILL_STEP = 5
"""Replica kills land after steps 1..5: a replacement (a vLLM start) served 6-27 s after its loss here (three replacing at
once on 2 cores), and the steps after step 5 took about as long (~25 s on a quiet machine, a trainer recovery
included: 0.5-1.7 s a step). So the last step waits for them: its training rows are held (`held_by_sample_index`)
until every replacement has said it serves; without that, a slower start (a busy machine) can end the run with a
replica still starting."""
TRAINER_KILL_STEPS = range(2, 11)
"""The trainer is killed twice, after two of steps 2..10 (a checkpoint every 2 steps: step 2's is the first to recover
from): once at a random moment (its rank may be idle, waiting for rollouts), once at the first moment after a random
delay that its process is busy (a train step, a weight push, a checkpoint save)."""
TRAINER_KILLS = 2
BUSY_CPU_S = 0.02
"""CPU seconds a rank spends in a 50 ms window when it is working (an idle actor process spends ~0)."""
JUDGE = "{fn = 'judge', args = { model = 'judge', parser = 'tests.support.e2e_rewards:judge_reply_length', max_new_tokens = 4, timeout_s = 120 }}"
OVERRIDES = [
    "--run.steps",
    str(STEPS),
    "--run.eval_every",
    "0",
    "--sample_logging.enabled",
    "false",
    "--checkpoint.every_steps",
    "2",
    "--run.max_trainer_recoveries",
    str(TRAINER_KILLS + 1),  # one spare: an extra recovery fails the count below, not the run
    "--generator.num_replicas",
    "2",
    "--services.reward.replicas",
    "2",
    "--models.judge.path",
    "tiny-qwen3",
    "--models.judge.replicas",
    "2",
    "--tasks.0.rubric.reward_fns",
    f"[{{fn = 'tests.support.e2e_rewards:held_by_sample_index'}}, {JUDGE}]",
    "--tasks.0.rubric.timeout_s",
    "600",  # the last step's rows wait in the reward for the replacements
]
SERVING_AGAIN = re.compile(r"rlmesh: (\S+) replica \d+ replaced; serving again ([\d.]+) s after the loss")
TRAINER_LOST = re.compile(r"rlmesh: (trainer lost after step \d+: .*)")


def kill_trainer_when_busy(launch: Launch, timeout: float = 30) -> None:
    """SIGKILL the trainer's rank as soon as it spends `BUSY_CPU_S` of CPU in 50 ms (or after `timeout` s)."""
    [pid] = trainer_pids(launch)
    rank = psutil.Process(pid)
    deadline, spent = time.monotonic() + timeout, sum(rank.cpu_times()[:2])
    while time.monotonic() < deadline:
        time.sleep(0.05)
        spent, before = sum(rank.cpu_times()[:2]), spent
        if spent - before >= BUSY_CPU_S:
            break
    os.kill(pid, signal.SIGKILL)


def test_a_run_survives_sigkills_of_a_generator_a_reward_and_a_judge_replica_and_the_trainer(tmp_path):
    seed = int(os.environ.get("RLMESH_TEST_SEED") or random.randrange(2**32))  # set it to replay a failure
    rng = random.Random(seed)
    victims = rng.sample(["generator", "reward", "frozen_judge"], 3)
    kills = list(zip(sorted(rng.sample(range(1, LAST_KILL_STEP + 1), 3)), victims))
    kills += zip(sorted(rng.sample(TRAINER_KILL_STEPS, TRAINER_KILLS)), ["trainer", "busy trainer"])
    kills.sort(key=lambda kill: kill[0])
    print(f"seed {seed}: killing (after step, what) {kills}")
    hold = tmp_path / "hold-the-last-step"
    hold.touch()
    launch = Launch(tmp_path, *OVERRIDES, env={HOLD_FROM_VERSION_ENV: str(STEPS - 1), HOLD_WHILE_ENV: str(hold)})
    try:
        waited, trainer_kills = 0, 0
        for step, victim in kills:
            if step > waited:  # once per step: a step trained again after a recovery prints again, others do not
                launch.wait_for_line(f"step {step:>4} v", timeout=600)
                waited = step
            if "trainer" in victim:  # the trainer killed before is recovered first (its step may print before)
                launch.wait_for_count("rlmesh: trainer recovered", trainer_kills, timeout=600)
                trainer_kills += 1
            time.sleep(rng.uniform(0.0, 2.0))
            if victim == "busy trainer":
                kill_trainer_when_busy(launch)
            else:
                [pid] = trainer_pids(launch) if victim == "trainer" else [replica_pid(launch, victim)]
                os.kill(pid, signal.SIGKILL)
        launch.wait_for_count("replaced; serving again", len(victims), timeout=600)
        hold.unlink()  # the last step may train: the run ends with every replica serving
        assert launch.wait_for_exit(timeout=900) == 0, launch.output()
        deadline = time.monotonic() + 10
        while processes_with_marker(launch.marker) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes_with_marker(launch.marker) == []  # a killed replica's children (vLLM's engine) too
    finally:
        launch.kill_everything()
    serving_again, step = [], 0
    for line in launch.lines:
        if line.startswith("step ") and " v" in line:
            step = int(line.split()[1])
        elif match := SERVING_AGAIN.search(line):
            serving_again.append((match[1], float(match[2]), step))
    print(f"loss -> replacement serving (service, s, after step): {serving_again}")
    trainer_lost = [match[1] for line in launch.lines if (match := TRAINER_LOST.search(line))]
    print("\n".join(trainer_lost))
    assert sorted(service for service, _, _ in serving_again) == sorted(victims), launch.text
    assert len(trainer_lost) == TRAINER_KILLS and launch.text.count("rlmesh: trainer recovered") == TRAINER_KILLS

    run_dir = tmp_path / "tiny_qwen3_e2e"
    assert_rows_trained_once(run_dir, STEPS, GROUPS_PER_STEP, GROUP_SIZE)  # every step logged once, in order
    train = [record for record in read_jsonl(run_dir / "rollouts.jsonl") if record["kind"] == "train"]
    assert all(record["rollout"]["status"] != "error" for record in train), [
        record["rollout"]["error"] for record in train if record["rollout"]["status"] == "error"
    ]
    # at staleness 0 each step's rollouts are sampled from the version the step before published, the replayed
    # steps' too: the recovered generators serve the checkpoint's version, not the lost trainer's newer one
    assert all(turn["policy_version"] == record["step"] - 1 for record in train for turn in record["rollout"]["turns"])
    records = [record for record in read_jsonl(run_dir / "metrics.jsonl") if record["step"] > 0]
    assert [record["policy_version"] for record in records] == list(range(1, STEPS + 1))
    assert max(abs(record["train/mismatch_k3"]) for record in records) < 1e-6  # fp32 sampler = trainer
    recoveries = [record["recovery/trainer_count"] for record in records if "recovery/trainer_count" in record]
    assert recoveries and max(recoveries) == TRAINER_KILLS, recoveries  # a later rewind may drop an earlier record
    last = records[-1]
    counted = {
        service: (last[f"services/{service}/restarts"], last[f"services/{service}/healthy_replicas"])
        for service in victims
    }
    assert counted == {service: (1, 2) for service in victims}, json.dumps(last)
