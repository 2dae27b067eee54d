"""EngineLoop with a LoRA policy: every request is (re)submitted with the adapter of the version it is tagged with."""

import asyncio
from types import SimpleNamespace

import pytest

from actors.engine_loop import EngineLoop


class RecordingEngine:
    """Stands in for vLLM's LLMEngine at its add/step/abort interface: records each submission's adapter and finishes
    a request on the step after it was added (the behaviour under test is EngineLoop's, not the engine's)."""

    def __init__(self):
        self.submitted: list[tuple[str, object]] = []
        self.pending: list[str] = []

    def add_request(self, request_id, prompt, params, lora_request=None):
        self.submitted.append((prompt, lora_request))
        self.pending.append(request_id)

    def step(self):
        finished, self.pending = self.pending, []
        return [
            SimpleNamespace(
                request_id=request_id, finished=True, outputs=[SimpleNamespace(token_ids=[7], logprobs=None)]
            )
            for request_id in finished
        ]

    def abort_request(self, request_ids):
        self.pending = [request_id for request_id in self.pending if request_id not in request_ids]


@pytest.mark.asyncio
async def test_requests_after_a_reload_carry_the_new_adapter_and_its_version():
    engine = RecordingEngine()
    loop = EngineLoop(engine)
    try:
        version = (await loop.generate("before", None)).version
        async with loop.pause("finish", 1, lora_request="adapter-v1"):
            pass
        version_after = (await loop.generate("after", None)).version
    finally:
        await loop.close()
    assert (version, version_after) == (0, 1)
    assert engine.submitted == [("before", None), ("after", "adapter-v1")]


@pytest.mark.asyncio
async def test_a_request_resubmitted_at_a_reload_runs_on_the_new_adapter():
    engine = RecordingEngine()
    engine.step = lambda: []  # nothing finishes until the reload
    loop = EngineLoop(engine)
    try:
        request = asyncio.create_task(loop.generate("in flight", None))
        while not engine.submitted:
            await asyncio.sleep(0.01)
        async with loop.pause("resubmit", 2, lora_request="adapter-v2"):
            engine.step = RecordingEngine.step.__get__(engine)
        version = (await asyncio.wait_for(request, 10)).version
    finally:
        await loop.close()
    assert version == 2
    assert engine.submitted == [("in flight", None), ("in flight", "adapter-v2")]
