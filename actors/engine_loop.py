"""A vLLM engine driven by one background loop, so many concurrent callers share its batches.

`EngineLoop.generate` adds one request and awaits its output; a single task steps the engine
while anything is unfinished, so requests that arrive while others decode join the running
batch (continuous batching) instead of queueing behind a blocking `LLM.generate`. Every engine
call runs on one dedicated thread: vLLM's in-process engine is not thread-safe, and the actor's
event loop stays free to accept calls while a step computes. That thread runs at the torch thread count of the thread
that made the loop (a pinned generator's, `rl.processes.affinity`): OpenMP keeps the count per thread, and a new
thread starts at the cores the process had when OpenMP loaded, until torch's first parallel op in it applies torch's
count. vLLM's CPU attention plans a step's split across threads at one count and checks it when it runs, so a
generator pinned to fewer cores failed the first steps of its engine thread ("Check failed: ... thread_num == thread_num
(2 vs. 1)").

`pause(mode)` makes the engine quiet for a weight reload:
    "finish"   — stop admitting, let in-flight requests finish on the old weights;
    "resubmit" — abort in-flight requests; after the reload they restart from their prompt,
                 so every token they return is sampled by the new weights;
    "continue" — abort in-flight requests keeping the tokens they sampled; after the reload each resumes from its
                 prompt plus those tokens (their KV cache recomputed under the new weights), so no token is sampled
                 twice and each is labelled with the version that sampled it.
Each request is stamped with the version the engine serves when it is dispatched to the engine (and again when a
reload resubmits it); a reload that fails leaves the engine closed for good (`refused`).

Requests belong to a `Lane`: the version and adapter they run under, paused together. An engine serving one policy has
one lane; one serving LoRA tenants has one per tenant (`actors.tenant_engine`), and a pause then holds back and waits
for that lane's requests alone.

Requests take turns on the engine by lane: a lane's requests enter only while no other lane's are on it. Lanes waiting
go in the order they asked; a lane whose turn comes brings in all of its requests waiting then, together, and adds no
more while another lane waits (one request a turn would decode every request alone, at a batch of one: slow, and on
other kernel paths than a batch's, `tests/unit/actors/test_tenant_batch_invariance.py`). vLLM's CPU LoRA path fails a
step whose batch mixes adapters (an `einsum` size mismatch in its `bgmv` ops), and scores prompt tokens (prompt logprobs)
through an adapter only in a step that holds nothing else, so a request made `alone` takes a turn of its own.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

OnWeightUpdate = Literal["finish", "resubmit", "continue"]

SEED_STRIDE = 1_000_003
"""A request resumed after `k` kept tokens samples with seed `seed x SEED_STRIDE + k` (mod 2^63): fresh noise for its
new positions, the same on every run, instead of its seed's stream again from the start."""


@dataclass(frozen=True)
class Finished:
    """A finished request: vLLM's output and the weights version that sampled each of its tokens."""

    output: Any
    """vLLM's finished `RequestOutput`. For a request continued across weight updates, its first completion's
    `token_ids` and `logprobs` hold every token: those kept at each pause, then the last submission's."""
    version: int
    """Version of the request's last submission (for a request never paused: the one that sampled all its tokens)."""
    token_versions: list[int]
    """Per token of the first completion, the version that sampled it."""


@dataclass
class Lane:
    """Requests served under one policy version and adapter, and paused together by its weight update."""

    name: str = ""
    """Whose requests they are (a LoRA tenant's name; empty for an engine's one policy)."""
    version: int = 0
    """The version the lane's requests are stamped with when they are (re)submitted."""
    lora_request: Any = None
    """The adapter of `version` the lane's requests are (re)submitted with (None: the engine's own weights)."""
    open: asyncio.Event = field(default_factory=asyncio.Event)
    """Cleared while the lane's weights are updated: its new requests wait."""
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while none of the lane's requests is live: from its call until it has left the engine for good (finished,
    failed, or cancelled before it reached the engine)."""
    live: int = 0

    def __post_init__(self) -> None:
        self.open.set()
        self.idle.set()

    def enter(self) -> None:
        self.live += 1
        self.idle.clear()

    def leave(self) -> None:
        self.live -= 1
        if self.live == 0:
            self.idle.set()


@dataclass
class EngineRequest:
    prompt: Any
    params: Any
    output: asyncio.Future
    lane: Lane
    turn: object
    """Requests of one turn share the engine's steps: the lane's name, or a token of the request's own (`alone`)."""
    version: int = 0
    """Weights version the request was last (re)submitted under: the one that samples the tokens of this submission."""
    latest: Any = None
    """The engine's newest (cumulative) output of the current submission: its tokens so far."""
    kept_token_ids: list[int] = field(default_factory=list)
    """Tokens sampled before the pauses of "continue" weight updates, kept and not sampled again."""
    kept_logprobs: list[Any] = field(default_factory=list)
    kept_versions: list[int] = field(default_factory=list)
    on_engine: bool = False
    """Submitted to the engine and not finished or aborted since."""

    def keep_sampled(self) -> None:
        """Keep the tokens the current submission sampled (it is being aborted for a "continue" weight update)."""
        if self.latest is not None:
            sample = self.latest.outputs[0]
            self.kept_token_ids += list(sample.token_ids)
            self.kept_logprobs += list(sample.logprobs or [])
            self.kept_versions += [self.version] * len(sample.token_ids)
            self.latest = None

    def engine_input(self) -> tuple[Any, Any]:
        """The prompt and sampling parameters of the next submission: after kept tokens, the prompt extended by them,
        the token budget less them, and a seed of their own (`SEED_STRIDE`)."""
        if not self.kept_token_ids:
            return self.prompt, self.params
        prompt = {**self.prompt, "prompt_token_ids": list(self.prompt["prompt_token_ids"]) + self.kept_token_ids}
        params = self.params.clone()
        if params.max_tokens is not None:
            params.max_tokens -= len(self.kept_token_ids)
        if params.seed is not None:
            params.seed = (self.params.seed * SEED_STRIDE + len(self.kept_token_ids)) % 2**63
        return prompt, params

    def finished(self, output: Any) -> Finished:
        """The request's result from the engine's finished output of its last submission (kept tokens put first)."""
        sample = output.outputs[0]
        versions = self.kept_versions + [self.version] * len(sample.token_ids)
        if self.kept_token_ids:
            output.prompt_token_ids = list(self.prompt["prompt_token_ids"])
            sample.token_ids = self.kept_token_ids + list(sample.token_ids)
            if sample.logprobs is not None:
                sample.logprobs = self.kept_logprobs + list(sample.logprobs)
        return Finished(output, self.version, versions)


class EngineLoop:
    def __init__(self, engine: Any, version: int = 0):
        self.engine = engine
        self.lane = Lane(version=version)
        """The lane of requests called without one (an engine serving one policy has no other)."""
        self._thread = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix="vllm-engine",
            initializer=torch._C.set_num_threads,  # vLLM's CPU worker makes `torch.set_num_threads` a no-op
            initargs=(torch.get_num_threads(),),
        )
        self._ids = itertools.count()
        self._requests: dict[str, EngineRequest] = {}  # engine request id -> request, until it finishes
        self._work = asyncio.Event()  # set when a request was added
        self._stepping = asyncio.Lock()  # held by the loop around each step; a pause takes it to stop stepping
        self._loop_task: asyncio.Task | None = None
        self._holder: object = None
        """The turn whose requests are on the engine (None: no request is)."""
        self._on_engine: Counter[object] = Counter()  # turn -> its requests on the engine
        self._waiting: list[EngineRequest] = []  # requests asking to enter, in order
        self._admitted: set[int] = set()
        """Ids of the waiting requests the turn on the engine brought in when it took the engine: they enter with it."""
        self._turns = asyncio.Condition()
        self._handing_on: set[asyncio.Future] = set()
        self.refused = False
        """A weight update failed half-way or did not prove its version: the engine takes no more requests."""

    @property
    def version(self) -> int:
        """The version requests of the default lane are stamped with."""
        return self.lane.version

    @version.setter
    def version(self, version: int) -> None:
        self.lane.version = version

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run `fn` on the engine thread (every engine access goes through here)."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, lambda: fn(*args, **kwargs))

    async def generate(self, prompt: Any, params: Any, lane: Lane | None = None, alone: bool = False) -> Finished:
        """One request's finished output and the weights version of each of its tokens; `lane`: the version and adapter
        it runs under (None: `self.lane`); `alone`: no other request shares the engine's steps while it is on it."""
        lane = self.lane if lane is None else lane
        await lane.open.wait()
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._drive())
        turn = object() if alone else lane.name
        request = EngineRequest(prompt, params, asyncio.get_running_loop().create_future(), lane, turn)
        lane.enter()
        try:
            await self._submit(request)
        except asyncio.CancelledError:
            if not request.on_engine:  # cancelled while waiting for its turn (`_take_turn`): it never runs
                request.output.cancel()
                lane.leave()
            raise
        return await request.output

    def _may_enter(self, request: EngineRequest) -> bool:
        if self._holder is None:
            return self._waiting[0] is request
        if self._holder != request.turn:
            return False
        return id(request) in self._admitted or all(waiting.turn == request.turn for waiting in self._waiting)

    def _stop_waiting(self, request: EngineRequest) -> None:
        self._waiting = [waiting for waiting in self._waiting if waiting is not request]
        self._admitted.discard(id(request))

    async def _take_turn(self, request: EngineRequest) -> None:
        """Wait until the request's turn may use the engine and count one more of its requests on it; the request
        that takes the engine for its turn brings in the turn's other waiting requests."""
        async with self._turns:
            self._waiting.append(request)
            try:
                await self._turns.wait_for(lambda: self._may_enter(request))
            except asyncio.CancelledError:  # it never runs: the turns asking after it must not wait behind it
                self._stop_waiting(request)
                self._turns.notify_all()
                raise
            self._stop_waiting(request)
            if self._holder is None:
                self._holder = request.turn
                self._admitted = {id(waiting) for waiting in self._waiting if waiting.turn == request.turn}
                self._turns.notify_all()
            self._on_engine[request.turn] += 1

    def _left_engine(self, request: EngineRequest) -> None:
        """`request` left the engine (finished, failed or aborted); the last of its turn hands the engine on."""
        self._on_engine[request.turn] -= 1
        if self._on_engine[request.turn] == 0 and self._holder == request.turn:
            del self._on_engine[request.turn]
            self._holder = None
            self._admitted = set()
            handing_on = asyncio.ensure_future(self._hand_on())
            self._handing_on.add(handing_on)
            handing_on.add_done_callback(self._handing_on.discard)

    async def _hand_on(self) -> None:
        async with self._turns:
            self._turns.notify_all()

    def _off_engine(self, request: EngineRequest) -> None:
        if request.on_engine:
            request.on_engine = False
            self._left_engine(request)

    def _done(self, request: EngineRequest) -> None:
        """`request` left the engine for good."""
        self._off_engine(request)
        request.lane.leave()

    async def _submit(self, request: EngineRequest) -> None:
        await self._take_turn(request)
        lane = request.lane
        request_id = str(next(self._ids))
        request.version = lane.version
        request.on_engine = True
        self._requests[request_id] = request
        prompt, params = request.engine_input()
        try:
            await self.call(self.engine.add_request, request_id, prompt, params, lora_request=lane.lora_request)
        except Exception as exc:
            del self._requests[request_id]
            request.output.set_exception(exc)
            self._done(request)
        self._work.set()

    async def _drive(self) -> None:
        while True:
            if not self._requests:
                self._work.clear()
                await self._work.wait()
                continue
            try:
                async with self._stepping:
                    outputs = await self.call(self.engine.step)
                    for output in outputs:  # recorded before a pause can take the engine: its tokens so far
                        if output.request_id in self._requests:
                            self._requests[output.request_id].latest = output
            except Exception as exc:  # the engine is broken: fail everyone waiting instead of hanging them
                failed = list(self._requests.values())
                self._requests.clear()
                for request in failed:
                    if not request.output.done():
                        request.output.set_exception(exc)
                    self._done(request)
                continue
            for output in outputs:
                if output.finished and output.request_id in self._requests:
                    request = self._requests.pop(output.request_id)
                    if not request.output.done():
                        request.output.set_result(request.finished(output))
                    self._done(request)
            await asyncio.sleep(0)  # let new callers add their requests between steps

    @asynccontextmanager
    async def pause(
        self, mode: OnWeightUpdate, new_version: int, lora_request: Any = None, lane: Lane | None = None
    ) -> AsyncIterator[None]:
        """Inside the block no request of `lane` (None: `self.lane`) runs on the engine and the lane's version is
        already `new_version` (what its requests are stamped with from then on); the block runs between two engine
        steps. After it the lane serves `new_version`, through the adapter `lora_request` when the policy is a LoRA
        adapter (loaded inside the block). A block that raises (a failed load, weights that did not prove the version)
        leaves the engine `refused`: the lane's requests waiting or aborted by the pause never run on it."""
        lane = self.lane if lane is None else lane
        lane.open.clear()
        resubmit: list[EngineRequest] = []
        try:
            if mode == "finish":
                await lane.idle.wait()
                async with self._stepping:
                    lane.version, lane.lora_request = new_version, lora_request
                    yield
            else:
                async with self._stepping:
                    ids = [request_id for request_id, request in self._requests.items() if request.lane is lane]
                    resubmit = [self._requests.pop(request_id) for request_id in ids]
                    await self.call(self.engine.abort_request, ids)
                    for request in resubmit:
                        self._off_engine(request)
                        if mode == "continue":
                            request.keep_sampled()
                        else:
                            request.latest = None
                    lane.version, lane.lora_request = new_version, lora_request
                    yield
        except BaseException:
            self.refused = True
            for _ in resubmit:  # never run again: the lane does not wait for them
                lane.leave()
            raise
        lane.open.set()
        for request in resubmit:
            await self._submit(request)

    async def close(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        self._thread.shutdown(wait=True)
