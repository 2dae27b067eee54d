"""An `EngineLoop` whose requests belong to tenants: each tenant has its own lane (version, adapter, pause).

One vLLM engine serves every LoRA tenant (`rl.loop.tenants`): every request goes in with its tenant's current
`LoRARequest`, and the tenants take turns on the engine's steps (`TenantEngineLoop`). A tenant's weight update pauses
its lane alone: "finish" waits for that tenant's requests only, "resubmit" aborts only its requests; the other tenants
keep their turns around the reload (it waits only for the step under way, to load the adapter between steps). Lanes,
pauses and the stamping of versions are `EngineLoop`'s; this module adds the turns.
"""

from __future__ import annotations

import asyncio
from typing import Any

from actors.engine_loop import EngineLoop, EngineRequest, Lane


class TenantEngineLoop(EngineLoop):
    """Engine steps hold one tenant's requests at a time: vLLM's CPU LoRA path fails a step whose batch mixes requests
    of different adapters (or with and without one: an `einsum` size mismatch in its `bgmv` ops, seen with two tenants
    at once), so a tenant's requests enter the engine only while no other tenant's are on it; tenants waiting take
    turns in the order they asked, and the tenant on the engine adds no more while another waits. A tenant's numbers do
    not depend on the batch it shares with its own requests (vLLM's CPU kernels give each row the same bits in any
    batch: `tests/unit/actors/test_tenant_batch_invariance.py`).

    Each tenant's requests are a lane of their own (`lanes`): `generate(..., lane)` and `pause(..., lane)` as for any
    `EngineLoop`."""

    def __init__(self, engine: Any, tenants: list[str]):
        super().__init__(engine)
        self.lanes = {tenant: Lane(name=tenant) for tenant in tenants}
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

    async def _take_turn(self, request: EngineRequest) -> None:
        """Wait for the request's tenant's turn on the engine and count one more of its requests on it."""
        tenant = request.lane.name
        async with self._turns:
            self._waiting.append(tenant)
            try:
                await self._turns.wait_for(lambda: self._may_enter(tenant))
            except asyncio.CancelledError:  # it never runs: the tenants asking after it must not wait behind it
                self._waiting.remove(tenant)
                self._turns.notify_all()
                raise
            self._waiting.remove(tenant)
            self._holder = tenant
            self._on_engine[tenant] += 1

    def _left_engine(self, request: EngineRequest) -> None:
        """One of a tenant's requests left the engine (finished, failed or aborted); its last hands the turn on."""
        tenant = request.lane.name
        self._on_engine[tenant] -= 1
        if self._on_engine[tenant] == 0 and self._holder == tenant:
            self._holder = None
            handing_on = asyncio.ensure_future(self._hand_on())
            self._handing_on.add(handing_on)
            handing_on.add_done_callback(self._handing_on.discard)

    async def _hand_on(self) -> None:
        async with self._turns:
            self._turns.notify_all()
