"""An `EngineLoop` whose requests belong to tenants: each tenant has its own lane (version, adapter, pause).

One vLLM engine serves every LoRA tenant (`rl.loop.tenants`): every request goes in with its tenant's current
`LoRARequest`, and the tenants take turns on the engine's steps (`TenantEngineLoop`). A tenant's weight update pauses
its lane alone: "finish" waits for that tenant's requests only, "resubmit" aborts only its requests; the other tenants
keep their turns around the reload (it waits only for the step under way, to load the adapter between steps). Lanes,
turns, pauses and the stamping of versions are `EngineLoop`'s; this module gives each tenant its lane.
"""

from __future__ import annotations

from typing import Any

from actors.engine_loop import EngineLoop, Lane


class TenantEngineLoop(EngineLoop):
    """An engine loop with one lane per tenant (`lanes`): `generate(..., lane)` and `pause(..., lane)` as for any
    `EngineLoop`, whose turns keep the tenants' requests out of each other's steps (vLLM's CPU LoRA path fails a step
    that mixes adapters, or rows with and without one). A tenant's numbers do not depend on the batch it shares with its
    own requests (vLLM's CPU kernels give each row the same bits in any batch:
    `tests/unit/actors/test_tenant_batch_invariance.py`)."""

    def __init__(self, engine: Any, tenants: list[str]):
        super().__init__(engine)
        self.lanes = {tenant: Lane(name=tenant) for tenant in tenants}
