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


class TwoStepEngine(RecordingEngine):
    """Finishes each request on its second step, and records which prompts each step held."""

    def __init__(self):
        super().__init__()
        self.steps: list[list[str]] = []
        self.prompts: dict[str, str] = {}
        self.seen: set[str] = set()

    def add_request(self, request_id, prompt, params, lora_request=None):
        super().add_request(request_id, prompt, params, lora_request)
        self.prompts[request_id] = prompt

    def step(self):
        self.steps.append(sorted(self.prompts[request_id] for request_id in self.pending))
        finished = [request_id for request_id in self.pending if request_id in self.seen]
        self.seen.update(self.pending)
        self.pending = [request_id for request_id in self.pending if request_id not in finished]
        return [
            SimpleNamespace(
                request_id=request_id, finished=True, outputs=[SimpleNamespace(token_ids=[7], logprobs=None)]
            )
            for request_id in finished
        ]


@pytest.mark.asyncio
async def test_a_request_made_alone_waits_for_the_engine_to_empty_and_steps_by_itself():
    """The requests on the engine finish; those that ask after it wait for it, then share their steps again."""
    engine = TwoStepEngine()
    loop = EngineLoop(engine)
    try:
        first = [asyncio.create_task(loop.generate(f"first {i}", None)) for i in range(2)]
        while not engine.steps:
            await asyncio.sleep(0.001)
        probe = asyncio.create_task(loop.generate("probe", None, alone=True))
        await asyncio.sleep(0)
        after = [asyncio.create_task(loop.generate(f"after {i}", None)) for i in range(2)]
        await asyncio.wait_for(asyncio.gather(*first, probe, *after), 10)
    finally:
        await loop.close()
    assert engine.steps == [["first 0", "first 1"]] * 2 + [["probe"]] * 2 + [["after 0", "after 1"]] * 2
