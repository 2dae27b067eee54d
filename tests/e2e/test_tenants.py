"""LoRA tenants on the tiny Qwen3 (fp32), with real Monarch actors and vLLM: five LoRA runs share one generator engine
(one adapter slot each) and one trainer (one adapter and optimizer each), and each tenant's run is its solo run.

Tenants: `tenant_a` (seed 0), `tenant_b` (seed 1), `tenant_c` (seed 1, its reward raising on every sample of a
trained policy, so every row from step 2 on fails and its breaker stops it), `tenant_d` (seed 2, stopped once its
step 1 is done) and `tenant_e` (seed 3, an infinite learning rate: its adapter is not finite after its first step, and
loaded into the shared engine it would give the others' requests NaN logprobs). `tenant_a`
and `tenant_b` must log the tokens and the metrics (all but timings and the shared services' counters) of their solo
runs at staleness 0, with the others failing or stopped beside them; each tenant's syncs are attested on its own
adapter, and a replica measuring one tenant's adapter against another tenant's fingerprints refuses it: that tenant's
sync fails, and the replica the tenants share is kept for the others. The one process of a tenant's own, its reward
replica (each tenant has its own reward service; the engine, the trainer and the launcher are shared), is SIGKILLed
while it scores a group of `tenant_b`'s step 2 (its reward takes 0.5 s on those rows, so the kill lands in a call): its
service replaces it and resubmits the group, and `tenant_b` too
logs its solo run.
"""

import asyncio
import os
import signal
from pathlib import Path

import pytest
import pytest_asyncio

from rl.config import load_config
from rl.loop.controller import Controller
from rl.loop.roles import SYNC_PROBE, refusal
from rl.loop.tenants import AdapterRefused, Tenants, TenantService
from tests.support.paths import TINY
from tests.support.runs import assert_same_run, comparable, read_jsonl

pytestmark = pytest.mark.asyncio(loop_scope="module")

DEADLINE_S = 900
STEPS = 4
RANK = 8

LORA = {
    "run.steps": str(STEPS),
    "run.eval_every": "2",
    "tasks.0.rubric.reward_fns": "[{fn = 'tests.support.e2e_rewards:even_token_share'}]",
    "trainer.lora.enabled": "true",
    "trainer.lora.rank": str(RANK),
    "trainer.lora.alpha": str(2 * RANK),
    "trainer.lr": "1e-2",
    "wandb.enabled": "false",
}
TENANTS = {
    "tenant_a": {"run.seed": "0", "trainer.seed": "0"},
    "tenant_b": {
        "run.seed": "1",
        "trainer.seed": "1",
        "tasks.0.rubric.reward_fns": "[{fn = 'tests.support.e2e_rewards:slow_at_version_1'}]",
    },
    "tenant_c": {
        "run.seed": "1",
        "trainer.seed": "1",
        "tasks.0.rubric.reward_fns": "[{fn = 'tests.support.e2e_rewards:fails_from_version_1'}]",
        "services.breaker.max_consecutive_failed_groups": "2",
    },
    "tenant_d": {"run.seed": "2", "trainer.seed": "2"},
    "tenant_e": {"run.seed": "3", "trainer.seed": "3", "trainer.lr": "inf"},
}
STOPPED = "tenant_d stopped by the test after its step 1"


async def stop_after_step(controller: Controller, step: int) -> None:
    """Stop `controller`'s run (as `rlmesh` stops one tenant) once it has finished `step`."""
    while controller.state.step < step:
        await asyncio.sleep(0.1)
    controller.stop_run(STOPPED)


async def kill_reward_replica_while_scoring(controller: Controller, step: int) -> int:
    """SIGKILL the reward replica of `controller`'s tenant while it scores a group of `step` (after `step - 1` is
    done); its pid."""
    while not (
        controller.state.step >= step - 1
        and (reward := getattr(controller.roles, "reward", None)) is not None
        and reward.healthy
        and reward.ledger.on(0)
    ):
        await asyncio.sleep(0.002)
    pid = reward.replicas[0].pid
    os.kill(pid, signal.SIGKILL)
    return pid


def tenant_config(output_dir: Path, name: str):
    return load_config(TINY, {**LORA, "run.output_dir": str(output_dir), "run.name": name, **TENANTS[name]})


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def runs(tmp_path_factory):
    solo_dir, tenants_dir = tmp_path_factory.mktemp("solo"), tmp_path_factory.mktemp("tenants")
    for name in ("tenant_a", "tenant_b"):
        await asyncio.wait_for(Controller(tenant_config(solo_dir, name)).run(), DEADLINE_S)
    tenants = Tenants([tenant_config(tenants_dir, name) for name in TENANTS], [None] * len(TENANTS))
    stopper = asyncio.create_task(stop_after_step(tenants.controllers["tenant_d"], 1))
    killer = asyncio.create_task(kill_reward_replica_while_scoring(tenants.controllers["tenant_b"], 2))
    try:
        await asyncio.wait_for(tenants.start(), DEADLINE_S)
        results = await asyncio.wait_for(
            asyncio.gather(*(c.run() for c in tenants.controllers.values()), return_exceptions=True), DEADLINE_S
        )
        killed = killer.result() if killer.done() else None
        rewards = {name: c.roles.reward for name, c in tenants.controllers.items()}
        shared = tenants.shared
        # tenant b's adapter measured against tenant a's fingerprints through b's own view of the service, as its sync
        # would be: b is refused alone, and the replica every tenant shares serves tenant a on, unchanged
        view_a, view_b = (TenantService(shared.generators, name) for name in ("tenant_a", "tenant_b"))
        a_before = await view_a.prompt_logprobs.route(SYNC_PROBE)
        version_b = tenants.controllers["tenant_b"].state.policy_version
        refused = None
        try:
            await view_b.update_weights.fanout(
                version_b, shared.tenants["tenant_a"].published, timeout_s=DEADLINE_S, refuse=refusal
            )
        except AdapterRefused as exc:
            refused = exc
        replicas_after = (len(shared.generators.healthy), shared.generators.restarts)
        a_after = await asyncio.wait_for(view_a.prompt_logprobs.route(SYNC_PROBE), DEADLINE_S)
        # tenant a's adapter (its last version, published under its name) measured against tenant b's fingerprints
        version_a = tenants.controllers["tenant_a"].state.policy_version
        others = shared.tenants["tenant_b"].published
        generator = shared.generators.actors()[0]
        crossed = await generator.update_weights.call_one(version_a, others, "tenant_a")
    finally:
        stopper.cancel()
        killer.cancel()
        await tenants.shared.stop()
    yield {
        "solo": solo_dir,
        "tenants": tenants_dir,
        "results": dict(zip(tenants.controllers, results)),
        "failures": {name: c.actor_failures for name, c in tenants.controllers.items()},
        "crossed": crossed,
        "others": others,
        "refused": refused,
        "replicas_after_refusal": replicas_after,
        "a_around_refusal": (a_before, a_after),
        "killed_reward_pid": killed,
        "reward_losses": {name: list(reward.losses) for name, reward in rewards.items()},
        "reward_recoveries": {name: len(reward.recoveries) for name, reward in rewards.items()},
    }


async def test_each_tenant_logs_its_solo_runs_tokens_and_metrics(runs):
    for name in ("tenant_a", "tenant_b"):
        assert isinstance(runs["results"][name], dict), runs["results"][name]
        assert_same_run(runs["tenants"] / name, runs["solo"] / name, steps=STEPS)
    solo_a, solo_b = (read_jsonl(runs["solo"] / name / "rollouts.jsonl") for name in ("tenant_a", "tenant_b"))
    assert solo_a != solo_b  # the seeds differ: equal logs would not tell the tenants apart


async def test_a_failing_tenant_stops_alone(runs):
    assert isinstance(runs["results"]["tenant_c"], BaseException)
    assert any("consecutive groups failed" in failure for failure in runs["failures"]["tenant_c"]), runs["failures"]
    records = [record for record in read_jsonl(runs["tenants"] / "tenant_c" / "metrics.jsonl") if record["step"] > 0]
    assert all(record["step"] <= 1 for record in records)  # its rows of version 1 failed: it stopped by step 1's end


async def test_a_stopped_tenant_stops_alone(runs):
    assert isinstance(runs["results"]["tenant_d"], BaseException)
    assert STOPPED in runs["failures"]["tenant_d"]
    steps = [record["step"] for record in read_jsonl(runs["tenants"] / "tenant_d" / "metrics.jsonl")]
    assert 1 in steps and max(steps) < STEPS  # it trained, and stopped before its end


async def test_a_tenant_whose_adapter_turns_non_finite_stops_alone(runs):
    result = runs["results"]["tenant_e"]
    assert isinstance(result, Exception) and "weights of policy version 1 are not finite" in str(result), result
    steps = [record["step"] for record in read_jsonl(runs["tenants"] / "tenant_e" / "metrics.jsonl")]
    assert max(steps) <= 1  # the sync of its first step failed: the generator did not load that adapter


async def test_every_tenant_sync_is_attested_on_its_own_adapter(runs):
    for name in ("tenant_a", "tenant_b"):
        records = [record for record in read_jsonl(runs["tenants"] / name / "metrics.jsonl") if record["step"] > 0]
        assert [record["weight_sync/attested"] for record in records] == [1.0] * STEPS
        assert all(comparable(record) for record in records)
    verdict = runs["crossed"].verdict
    assert not verdict.attested
    named = {failure.split(":")[0] for failure in verdict.failures}
    others = runs["others"]
    assert set(others.tensors) <= named  # every tensor of the other tenant's adapter differs from this tenant's


async def test_a_tenant_refused_by_the_shared_replica_stops_alone_and_the_replica_serves_the_others_on(runs):
    assert isinstance(runs["refused"], AdapterRefused) and "tenant tenant_b" in str(runs["refused"]), runs["refused"]
    assert runs["replicas_after_refusal"] == (1, 0)  # healthy replicas, restarts: the shared replica was not replaced
    before, after = runs["a_around_refusal"]
    assert after == before and len(after) == len(SYNC_PROBE)


async def test_a_tenant_whose_reward_replica_is_killed_recovers_it_alone(runs):
    pid = runs["killed_reward_pid"]
    assert pid is not None  # killed while it scored a group of tenant_b's step 2
    [loss] = runs["reward_losses"]["tenant_b"]
    assert loss.startswith("reward_tenant_b/0#0: ") and ("Killed(sig=9)" in loss or f"process {pid} exited" in loss)
    assert runs["reward_recoveries"]["tenant_b"] == 1
    last = read_jsonl(runs["tenants"] / "tenant_b" / "metrics.jsonl")[-1]
    assert last["services/reward_tenant_b/restarts"] == 1 and last["services/reward_tenant_b/resubmitted_requests"] >= 1
    assert all(not losses for name, losses in runs["reward_losses"].items() if name != "tenant_b")
    # tenant_b's and tenant_a's tokens and metrics equal their solo runs': test_each_tenant_logs_its_solo_runs_...
