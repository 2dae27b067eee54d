"""An `EngineLoop` whose requests belong to tenants: each tenant has its own lane (version, adapter, pause).

One vLLM engine serves every LoRA tenant (`rl.loop.tenants`): every request goes in with its tenant's current
`LoRARequest`, and the tenants take turns on the engine's steps (`TenantEngineLoop`). A tenant's weight update pauses
its lane alone: "finish" waits for that tenant's requests only, "resubmit" aborts only its requests; the other tenants
keep their turns around the reload (it waits only for the step under way, to load the adapter between steps).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from actors.engine_loop import EngineLoop, EngineRequest, OnWeightUpdate


@dataclass
class Lane:
    """One tenant's view of the engine."""

    version: int = 0
    """The tenant's policy version its requests are stamped with."""
    lora_request: Any = None
    """The adapter of `version` every request of the tenant is (re)submitted with (None: the base model)."""
    open: asyncio.Event = field(default_factory=asyncio.Event)
    """Cleared while the tenant's weights are updated: its new requests wait."""
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    """Set while none of the tenant's requests is unfinished."""
    unfinished: int = 0

    def __post_init__(self) -> None:
        self.open.set()
        self.idle.set()


@dataclass
class TenantRequest(EngineRequest):
    tenant: str = ""
    on_engine: bool = False
    """Submitted to the engine and not finished or aborted since."""


class TenantEngineLoop(EngineLoop):
    """Engine steps hold one tenant's requests at a time: vLLM's CPU LoRA path fails a step whose batch mixes requests
    of different adapters (or with and without one: an `einsum` size mismatch in its `bgmv` ops, seen with two tenants
    at once), so a tenant's requests enter the engine only while no other tenant's are on it; tenants waiting take
    turns in the order they asked, and the tenant on the engine adds no more while another waits. A tenant's numbers do
    not depend on the batch it shares with its own requests (vLLM's CPU kernels give each row the same bits in any
    batch: `tests/unit/actors/test_tenant_batch_invariance.py`)."""

    def __init__(self, engine: Any, tenants: list[str]):
        super().__init__(engine)
        self.lanes = {tenant: Lane() for tenant in tenants}
        self._holder: str | None = None
        """The tenant whose requests are on the engine (None: none are)."""
        self._on_engine = dict.fromkeys(tenants, 0)
        self._waiting: list[str] = []  # tenants asking for a turn, in order (once per request)
        self._turns = asyncio.Condition()
        self._handing_on: set[asyncio.Future] = set()

    def _may_enter(self, tenant: str) -> bool:
        if self._holder is None:
            return self._waiting[0] == tenant
        return self._holder == tenant and all(waiting == tenant for waiting in self._waiting)

    async def _enter(self, tenant: str) -> None:
        """Wait for `tenant`'s turn on the engine and count one more of its requests on it."""
        async with self._turns:
            self._waiting.append(tenant)
            await self._turns.wait_for(lambda: self._may_enter(tenant))
            self._waiting.remove(tenant)
            self._holder = tenant
            self._on_engine[tenant] += 1

    def _left(self, request: TenantRequest) -> None:
        if request.on_engine:
            request.on_engine = False
            self._leave(request.tenant)

    def _leave(self, tenant: str, requests: int = 1) -> None:
        """`requests` of `tenant`'s left the engine (finished, failed or aborted); the last hands the turn on."""
        self._on_engine[tenant] -= requests
        if self._on_engine[tenant] == 0 and self._holder == tenant:
            self._holder = None
            handing_on = asyncio.ensure_future(self._hand_on())
            self._handing_on.add(handing_on)
            handing_on.add_done_callback(self._handing_on.discard)

    async def _hand_on(self) -> None:
        async with self._turns:
            self._turns.notify_all()

    async def generate_for(self, tenant: str, prompt: Any, params: Any) -> tuple[Any, int]:
        """The finished `RequestOutput` of one request of `tenant` and the tenant's version that produced it."""
        lane = self.lanes[tenant]
        await lane.open.wait()
        if self._loop_task is None:
            self._loop_task = asyncio.create_task(self._drive())
        request = TenantRequest(prompt, params, asyncio.get_running_loop().create_future(), tenant=tenant)
        lane.unfinished += 1
        lane.idle.clear()
        request.output.add_done_callback(lambda _: self._finished(lane))
        request.output.add_done_callback(lambda _: self._left(request))
        try:
            await self._submit(request)
        except asyncio.CancelledError:
            if not request.on_engine:  # cancelled while waiting for its turn: it never runs
                request.output.cancel()
            raise
        finished = await request.output
        return finished.output, finished.version

    @staticmethod
    def _finished(lane: Lane) -> None:
        lane.unfinished -= 1
        if lane.unfinished == 0:
            lane.idle.set()

    async def _submit(self, request: TenantRequest) -> None:
        """As `EngineLoop._submit`, with the request's tenant's version and adapter."""
        lane = self.lanes[request.tenant]
        await self._enter(request.tenant)
        request.on_engine = True
        request_id = str(next(self._ids))
        request.version = lane.version
        self._requests[request_id] = request
        self._idle.clear()
        try:
            await self.call(
                self.engine.add_request, request_id, request.prompt, request.params, lora_request=lane.lora_request
            )
        except Exception as exc:
            del self._requests[request_id]
            request.output.set_exception(exc)
        self._work.set()
        if not self._requests:
            self._idle.set()

    @asynccontextmanager
    async def pause_lane(
        self, tenant: str, mode: OnWeightUpdate, new_version: int, lora_request: Any
    ) -> AsyncIterator[None]:
        """`EngineLoop.pause` for `tenant`'s requests alone; the block runs between two engine steps. A block that
        raises leaves the engine `refused` and the tenant's lane closed."""
        lane = self.lanes[tenant]
        lane.open.clear()
        resubmit: list[TenantRequest] = []
        try:
            if mode == "finish":
                await lane.idle.wait()
                async with self._stepping:
                    lane.version, lane.lora_request = new_version, lora_request
                    yield
            else:
                async with self._stepping:
                    ids = [rid for rid, request in self._requests.items() if request.tenant == tenant]
                    resubmit = [self._requests.pop(rid) for rid in ids]
                    await self.call(self.engine.abort_request, ids)
                    for request in resubmit:
                        self._left(request)
                    if not self._requests:
                        self._idle.set()
                    lane.version, lane.lora_request = new_version, lora_request
                    yield
        except BaseException:
            self.refused = True
            raise
        lane.open.set()
        for request in resubmit:
            await self._submit(request)
