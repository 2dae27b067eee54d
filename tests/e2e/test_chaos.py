"""Chaos: a 24-step run of the tiny model while a helper SIGKILLs a generator replica, a reward replica and a
frozen-model (judge) replica at random moments. The run completes, each row is trained once, every
rollout was scored (no error), each service counts its restart and its replacement serves, and no
process outlives the run.

Processes are found by their names (`rl.processes.titles`: `generator/0#0`, ...). The seconds from each
kill's loss to its replacement serving (the services' "serving again" lines) are printed (`pytest -s`).
"""

import json
import os
import random
import re
import signal
import time

from tests.support.launch import Launch, processes_with_marker, replica_pid
from tests.support.runs import assert_rows_trained_once, read_jsonl

STEPS, GROUPS_PER_STEP, GROUP_SIZE = 24, 2, 4
LAST_KILL_STEP = 5
"""Kills land after steps 1..5: a replacement (a vLLM start) served 6-27 s after its loss here, 3-14 steps (three
replacing at once on 2 cores, steps of ~2 s when the machine is quiet), well before the last step."""
JUDGE = "{fn = 'judge', args = { model = 'judge', parser = 'tests.support.e2e_rewards:judge_reply_length', max_new_tokens = 4, timeout_s = 120 }}"
OVERRIDES = [
    "--run.steps",
    str(STEPS),
    "--run.eval_every",
    "0",
    "--sample_logging.enabled",
    "false",
    "--checkpoint.every_steps",
    "0",
    "--generator.num_replicas",
    "2",
    "--services.reward.replicas",
    "2",
    "--models.judge.path",
    "tiny-qwen3",
    "--models.judge.replicas",
    "2",
    "--tasks.0.rubric.reward_fns",
    f"[{{fn = 'tests.support.e2e_rewards:by_sample_index'}}, {JUDGE}]",
]
SERVING_AGAIN = re.compile(r"rlmesh: (\S+) replica \d+ replaced; serving again ([\d.]+) s after the loss")


def test_a_run_survives_sigkills_of_a_generator_a_reward_and_a_judge_replica(tmp_path):
    seed = int(os.environ.get("RLMESH_TEST_SEED") or random.randrange(2**32))  # set it to replay a failure
    rng = random.Random(seed)
    victims = rng.sample(["generator", "reward", "frozen_judge"], 3)
    kill_steps = sorted(rng.sample(range(1, LAST_KILL_STEP + 1), 3))
    print(f"seed {seed}: killing {victims} after steps {kill_steps}")
    launch = Launch(tmp_path, *OVERRIDES)
    try:
        for service, step in zip(victims, kill_steps):
            launch.wait_for_line(f"step {step:>4} v", timeout=600)
            time.sleep(rng.uniform(0.0, 2.0))
            os.kill(replica_pid(launch.marker, service), signal.SIGKILL)
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
    assert sorted(service for service, _, _ in serving_again) == sorted(victims), "".join(launch.lines)
    run_dir = tmp_path / "tiny_qwen3_e2e"
    assert_rows_trained_once(run_dir, STEPS, GROUPS_PER_STEP, GROUP_SIZE)
    train = [record["rollout"] for record in read_jsonl(run_dir / "rollouts.jsonl") if record["kind"] == "train"]
    assert all(rollout["status"] != "error" for rollout in train), [
        rollout["error"] for rollout in train if rollout["status"] == "error"
    ]
    last = read_jsonl(run_dir / "metrics.jsonl")[-1]
    counted = {
        service: (last[f"services/{service}/restarts"], last[f"services/{service}/healthy_replicas"])
        for service in victims
    }
    assert counted == {service: (1, 2) for service in victims}, json.dumps(last)
