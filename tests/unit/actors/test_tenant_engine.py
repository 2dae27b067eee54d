"""TenantEngineLoop: each tenant's requests carry its own adapter and version, and a tenant's reload pauses only its lane."""

import asyncio
from types import SimpleNamespace

import pytest

from actors.tenant_engine import TenantEngineLoop


class RecordingEngine:
    """Stands in for vLLM's LLMEngine at its add/step/abort interface: records each submission's adapter and finishes
    the requests not held back on the next step (the behaviour under test is the loop's, not the engine's)."""

    def __init__(self):
        self.submitted: list[tuple[str, object]] = []
        self.pending: dict[str, str] = {}  # request id -> prompt
        self.aborted: list[str] = []
        self.hold: set[str] = set()  # prompts that do not finish

    def add_request(self, request_id, prompt, params, lora_request=None):
        self.submitted.append((prompt, lora_request))
        self.pending[request_id] = prompt

    def step(self):
        finished = [rid for rid, prompt in self.pending.items() if prompt not in self.hold]
        for rid in finished:
            del self.pending[rid]
        return [
            SimpleNamespace(request_id=rid, finished=True, outputs=[SimpleNamespace(token_ids=[7], logprobs=None)])
            for rid in finished
        ]

    def abort_request(self, request_ids):
        for rid in request_ids:
            self.aborted.append(self.pending.pop(rid))


async def generate(loop: TenantEngineLoop, tenant: str, prompt: str) -> tuple[list[int], int]:
    finished = await loop.generate(prompt, None, loop.lanes[tenant])
    return finished.output.outputs[0].token_ids, finished.version


async def submitted(engine: RecordingEngine, prompt: str) -> None:
    while prompt not in [p for p, _ in engine.submitted]:
        await asyncio.sleep(0.01)


@pytest.mark.asyncio
async def test_each_tenants_requests_carry_its_own_adapter_and_version():
    engine = RecordingEngine()
    loop = TenantEngineLoop(engine, ["a", "b"])
    try:
        async with loop.pause("finish", 1, "a-v1", loop.lanes["a"]):
            pass
        (_, version_a), (_, version_b) = await asyncio.gather(
            generate(loop, "a", "from a"), generate(loop, "b", "from b")
        )
    finally:
        await loop.close()
    assert (version_a, version_b) == (1, 0)
    assert sorted(engine.submitted) == [("from a", "a-v1"), ("from b", None)]


@pytest.mark.asyncio
async def test_a_tenants_finish_reload_waits_for_its_own_requests_only():
    engine = RecordingEngine()
    engine.hold = {"b in flight"}
    loop = TenantEngineLoop(engine, ["a", "b"])
    try:
        b_request = asyncio.create_task(generate(loop, "b", "b in flight"))
        await submitted(engine, "b in flight")
        async with asyncio.timeout(10):  # would hang if it waited for b's request
            async with loop.pause("finish", 1, "a-v1", loop.lanes["a"]):
                pass
        a_request = asyncio.create_task(generate(loop, "a", "a after"))
        await asyncio.sleep(0.1)
        assert not a_request.done() and not b_request.done()  # a's request waits for b's turn on the engine to end
        engine.hold = set()
        (_, version), (_, b_version) = await asyncio.wait_for(asyncio.gather(a_request, b_request), 10)
    finally:
        await loop.close()
    assert (version, b_version) == (1, 0)


@pytest.mark.asyncio
async def test_a_tenants_resubmit_reload_aborts_and_resubmits_only_its_requests():
    engine = RecordingEngine()
    engine.hold = {"a in flight"}
    loop = TenantEngineLoop(engine, ["a", "b"])
    try:
        a_request = asyncio.create_task(generate(loop, "a", "a in flight"))
        await submitted(engine, "a in flight")
        b_request = asyncio.create_task(generate(loop, "b", "b waiting"))
        await asyncio.sleep(0.1)
        async with loop.pause("resubmit", 2, "a-v2", loop.lanes["a"]):
            engine.hold = set()
        (_, a_version), (_, b_version) = await asyncio.wait_for(asyncio.gather(a_request, b_request), 10)
    finally:
        await loop.close()
    assert engine.aborted == ["a in flight"]
    assert (a_version, b_version) == (2, 0)
    assert engine.submitted == [("a in flight", None), ("b waiting", None), ("a in flight", "a-v2")]


@pytest.mark.asyncio
async def test_no_engine_step_holds_two_tenants_requests():
    engine = RecordingEngine()
    steps: list[set[str]] = []
    step = engine.step

    def recording_step():
        steps.append({prompt.split()[0] for prompt in engine.pending.values()})
        return step()

    engine.step = recording_step
    loop = TenantEngineLoop(engine, ["a", "b", "c"])
    try:
        prompts = [(tenant, f"{tenant} {index}") for index in range(6) for tenant in ("a", "b", "c")]
        results = await asyncio.wait_for(
            asyncio.gather(*(generate(loop, tenant, prompt) for tenant, prompt in prompts)), 10
        )
    finally:
        await loop.close()
    assert len(results) == 18 and len(engine.submitted) == 18
    assert all(len(tenants) <= 1 for tenants in steps), steps
    assert {tenant for tenants in steps for tenant in tenants} == {"a", "b", "c"}


@pytest.mark.asyncio
async def test_a_tenants_waiting_requests_enter_together_when_its_turn_comes():
    """Requests of three tenants asking at once: `a 0` takes the engine alone (nobody waited), then each tenant's turn
    brings in every request of it waiting, so each steps as one batch (not one request a turn, which would decode every
    request at a batch of one)."""
    engine = RecordingEngine()
    steps: list[list[str]] = []
    step = engine.step

    def recording_step():
        steps.append(sorted(engine.pending.values()))
        return step()

    engine.step = recording_step
    loop = TenantEngineLoop(engine, ["a", "b", "c"])
    try:
        prompts = [(tenant, f"{tenant} {index}") for index in range(6) for tenant in ("a", "b", "c")]
        await asyncio.wait_for(asyncio.gather(*(generate(loop, tenant, prompt) for tenant, prompt in prompts)), 10)
    finally:
        await loop.close()
    assert steps == [
        ["a 0"],
        [f"b {index}" for index in range(6)],
        [f"c {index}" for index in range(6)],
        [f"a {index}" for index in range(1, 6)],
    ]


@pytest.mark.asyncio
async def test_a_cancelled_request_keeps_its_tenants_turn_until_it_leaves_the_engine_and_a_cancelled_waiter_blocks_none():
    engine = RecordingEngine()
    engine.hold = {"a held"}
    loop = TenantEngineLoop(engine, ["a", "b", "c"])
    try:
        a_request = asyncio.create_task(generate(loop, "a", "a held"))
        await submitted(engine, "a held")
        c_request = asyncio.create_task(generate(loop, "c", "c cancelled"))
        b_request = asyncio.create_task(generate(loop, "b", "b after"))
        await asyncio.sleep(0.1)
        a_request.cancel()  # its request still runs on the engine: no other tenant's may join its steps
        c_request.cancel()  # it never reached the engine: b, asking after it, must not wait behind it
        await asyncio.sleep(0.1)
        assert [prompt for prompt, _ in engine.submitted] == ["a held"]
        engine.hold = set()
        await asyncio.wait_for(b_request, 10)
    finally:
        await loop.close()
    assert [prompt for prompt, _ in engine.submitted] == ["a held", "b after"]
