"""Generator replicas that die or hang, on the tiny Qwen3 with real Monarch and vLLM. (A rubric that always fails
opens the circuit breaker: tests/unit/rl/loop/test_controller_failures.py; the CLI's message: tests/unit/rl/commands/test_cli.py.)

Each test is one short run. A replica is killed with SIGKILL by the pid its `ping` reports, while
it holds requests of the second step; a hang is injected by `RLMESH_FAULT` (`rl.services.replica.FAULT_ENV`).
"""

import asyncio
import json
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path

from rl.checkpoint import store as checkpoint
from rl.config import load_config
from rl.loop.controller import Controller
from rl.loop.state import row_index_of
from rl.services.replica import FAULT_ENV
from tests.support.paths import E2E_CONFIGS

DEADLINE_S = 600


def two_replica_config(tmp_path: Path, **overrides: str):
    return load_config(
        E2E_CONFIGS / "tiny_qwen3_e2e.toml",
        {
            "run.output_dir": str(tmp_path),
            "run.steps": "3",
            "run.eval_every": "0",
            "generator.num_replicas": "2",
            "wandb.enabled": "false",
            "sample_logging.enabled": "false",
            "tasks.0.rubric.reward_fns": "[{fn = 'tests.support.e2e_rewards:even_token_share'}]",
            "services.generator.call_timeout_s": "60",
            **overrides,
        },
    )


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_every_row_trained_once(run_dir: Path) -> None:
    """Rollout ids in rollouts.jsonl: each row's group trained in exactly one step; the data cursor covers them all."""
    train = [record for record in read_jsonl(run_dir / "rollouts.jsonl") if record["kind"] == "train"]
    ids = [record["rollout"]["rollout_id"] for record in train]
    assert len(ids) == len(set(ids)) == 3 * 2 * 4  # steps x groups x group size
    steps_of_row = {}
    for record in train:
        steps_of_row.setdefault(row_index_of(record["rollout"]["group_id"]), set()).add(record["step"])
    assert all(len(steps) == 1 for steps in steps_of_row.values())
    assert Counter(step for steps in steps_of_row.values() for step in steps) == {1: 2, 2: 2, 3: 2}
    state = checkpoint.read(checkpoint.newest_checkpoint(run_dir), checkpoint.RUN_STATE)
    assert state["step"] == 3 and state["rows_done_ahead"] == []
    assert sorted(steps_of_row) == list(range(state["data_cursor"]))


async def test_a_killed_generator_replica_is_replaced_and_no_row_is_lost(tmp_path):
    controller = Controller(two_replica_config(tmp_path))
    await asyncio.wait_for(controller.setup(), DEADLINE_S)
    try:
        training = asyncio.ensure_future(controller.train())
        generators = controller.roles.generators
        while not (controller.state.step >= 1 and generators.ledger.on(0)):  # replica 0 holds requests of step 2
            assert not training.done()
            await asyncio.sleep(0.002)
        pid = generators.replicas[0].pid
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        summary = await asyncio.wait_for(training, DEADLINE_S)
        while not generators.recoveries:  # the replacement may still be starting when the last step ends
            assert time.monotonic() - killed_at < DEADLINE_S
            await asyncio.sleep(0.05)
        assert generators.healthy == [0, 1] and str(generators.replicas[0].id) == "generator/0#1"
        assert await generators.call("ping", key=None) in {generators.replicas[0].pid, generators.replicas[1].pid}
    finally:
        await controller.shutdown()
    [(lost_at, serving_at)] = generators.recoveries
    print(
        f"\nSIGKILL of generator replica 0 (pid {pid}) -> loss noticed {lost_at - killed_at:.1f} s -> "
        f"replacement taking traffic {serving_at - killed_at:.1f} s",
        file=sys.stderr,
    )
    run_dir = Path(summary["run_dir"])
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert metrics[-1]["services/generator/restarts"] == 1
    assert metrics[-1]["services/generator/resubmitted_requests"] >= 1
    assert [loss.split(":")[0] for loss in generators.losses] == ["generator/0#0"]
    # our pid check, or Monarch's supervision
    assert "exited" in generators.losses[0] or "Killed(sig=9)" in generators.losses[0]
    assert [m["rollouts/status/error"] for m in metrics] == [0] * len(metrics)  # in every step record
    assert_every_row_trained_once(run_dir)


async def test_a_hung_generator_replica_misses_its_deadline_and_the_other_serves_its_requests(tmp_path, monkeypatch):
    monkeypatch.setenv(FAULT_ENV, "hang:generator/0#0")  # inherited by the actor processes
    controller = Controller(two_replica_config(tmp_path, **{"services.generator.call_timeout_s": "20"}))
    await asyncio.wait_for(controller.setup(), DEADLINE_S)
    try:
        summary = await asyncio.wait_for(controller.train(), DEADLINE_S)
    finally:
        await controller.shutdown()
    generators = controller.roles.generators
    assert generators.losses[0].startswith(
        "generator/0#0: generate missed its deadline (services.generator.call_timeout_s = 20.0)"
    )
    metrics = read_jsonl(Path(summary["run_dir"]) / "metrics.jsonl")
    assert (
        metrics[-1]["services/generator/restarts"] >= 1 and metrics[-1]["services/generator/resubmitted_requests"] >= 1
    )
    assert generators.failed_requests == 0
    assert [m["rollouts/status/error"] for m in metrics] == [0] * len(metrics)  # in every step record
    assert_every_row_trained_once(Path(summary["run_dir"]))
