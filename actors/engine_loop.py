"""A vLLM engine driven by one background loop, so many concurrent callers share its batches.

`EngineLoop.generate` adds one request and awaits its output; a single task steps the engine
while anything is unfinished, so requests that arrive while others decode join the running
batch (continuous batching) instead of queueing behind a blocking `LLM.generate`. Every engine
call runs on one dedicated thread: vLLM's in-process engine is not thread-safe, and the actor's
event loop stays free to accept calls while a step computes.

`pause(mode)` makes the engine quiet for a weight reload:
    "finish"   — stop admitting, let in-flight requests finish on the old weights;
    "resubmit" — abort in-flight requests; after the reload they restart from their prompt,
                 so every token they return is sampled by the new weights.
Each request is stamped with the version the engine serves when it is dispatched to the engine (and again when a
reload resubmits it); a reload that fails leaves the engine closed for good (`refused`).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

OnWeightUpdate = Literal["finish", "resubmit"]


@dataclass
class _Request:
    prompt: Any
    params: Any
    output: asyncio.Future
    version: int = 0
    """Weights version the request was last (re)submitted under: the one that samples all its tokens."""


class EngineLoop:
    def __init__(self, engine: Any, version: int = 0):
        self.engine = engine
        self.version = version
        self.lora_request: Any = None
        """The LoRA adapter of `version` that every request is (re)submitted with (None: the engine's own weights)."""
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vllm-engine")
        self._ids = itertools.count()
        self._requests: dict[str, _Request] = {}  # engine request id -> request, until it finishes
        self._open = asyncio.Event()  # cleared while paused: new requests wait
        self._open.set()
        self._work = asyncio.Event()  # set when a request was added
        self._idle = asyncio.Event()  # set while no request is on the engine
        self._idle.set()
        self._stepping = asyncio.Lock()  # held by the loop around each step; a pause takes it to stop stepping
        self._loop_task: asyncio.Task | None = None
        self.refused = False
        """A weight update failed half-way or did not prove its version: the engine takes no more requests."""

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run `fn` on the engine thread (every engine access goes through here)."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, lambda: fn(*args, **kwargs))

    async def generate(self, prompt: Any, params: Any) -> tuple[Any, int]:
        """The finished `RequestOutput` of one request and the weights version that produced it."""
        await self._open.wait()
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._drive())
        request = _Request(prompt, params, asyncio.get_running_loop().create_future())
        await self._submit(request)
        return await request.output, request.version

    async def _submit(self, request: _Request) -> None:
        request_id = str(next(self._ids))
        request.version = self.version
        self._requests[request_id] = request
        self._idle.clear()
        try:
            await self.call(
                self.engine.add_request, request_id, request.prompt, request.params, lora_request=self.lora_request
            )
        except Exception as exc:
            del self._requests[request_id]
            request.output.set_exception(exc)
        self._work.set()
        if not self._requests:
            self._idle.set()

    async def _drive(self) -> None:
        while True:
            if not self._requests:
                self._work.clear()
                await self._work.wait()
                continue
            try:
                async with self._stepping:
                    outputs = await self.call(self.engine.step)
            except Exception as exc:  # the engine is broken: fail everyone waiting instead of hanging them
                for request in self._requests.values():
                    if not request.output.done():
                        request.output.set_exception(exc)
                self._requests.clear()
                self._idle.set()
                continue
            for output in outputs:
                if output.finished and output.request_id in self._requests:
                    request = self._requests.pop(output.request_id)
                    if not request.output.done():
                        request.output.set_result(output)
            if not self._requests:
                self._idle.set()
            await asyncio.sleep(0)  # let new callers add their requests between steps

    @asynccontextmanager
    async def pause(self, mode: OnWeightUpdate, new_version: int, lora_request: Any = None) -> AsyncIterator[None]:
        """Inside the block no request runs on the engine and `version` is already `new_version` (what requests are
        stamped with from then on); after it the engine serves `new_version`, through the adapter `lora_request` when
        the policy is a LoRA adapter (loaded inside the block). A block that raises (a failed load, weights that did
        not prove the version) leaves the engine `refused`: requests waiting or aborted by the pause never run on it."""
        self._open.clear()
        resubmit: list[_Request] = []
        try:
            if mode == "finish":
                await self._idle.wait()
                async with self._stepping:
                    self.version, self.lora_request = new_version, lora_request
                    yield
            else:
                async with self._stepping:
                    resubmit = list(self._requests.values())
                    await self.call(self.engine.abort_request, list(self._requests))
                    self._requests.clear()
                    self._idle.set()
                    self.version, self.lora_request = new_version, lora_request
                    yield
        except BaseException:
            self.refused = True
            raise
        self._open.set()
        for request in resubmit:
            await self._submit(request)

    async def close(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        self._thread.shutdown(wait=True)
