"""The gateway: another process's way into the controller's services, through their routers.

A `Service` lives in the controller's process and event loop. A judge reward function runs in a
RewardActor process; it reaches a frozen model through the `ServiceGateway`, an actor spawned in the
controller's process, which replays each call as `Service.call` on the controller's loop. So a judge's
requests get what the controller's own get: least-outstanding routing over the healthy replicas,
failover to another replica when one is lost, the `call_timeout_s` deadline, and replacements.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from typing import Any

from monarch.actor import Actor, concurrent_endpoint, this_proc

from rl.services.service import Service

_OPEN: dict[str, tuple[dict[str, Service], asyncio.AbstractEventLoop]] = {}
_IDS = itertools.count()


class ServiceGateway(Actor):
    """Serves `call(service, endpoint, *args)` on the services `open_gateway` registered in this process."""

    def __init__(self, key: str):
        self.key = key

    @concurrent_endpoint
    async def call(self, service: str, endpoint: str, *args: Any, key: str | None = None) -> Any:
        """`Service.call` on the controller's loop; RequestFailed (or the endpoint's own error) comes back as the call's error."""
        services, loop = _OPEN[self.key]
        if service not in services:
            raise KeyError(f"no service {service!r} behind this gateway (have {sorted(services)})")
        return await asyncio.wrap_future(
            asyncio.run_coroutine_threadsafe(services[service].call(endpoint, *args, key=key), loop)
        )


@dataclass
class Gateway:
    key: str
    actor: Any
    """The `ServiceGateway` actor: hand it to other processes."""

    def close(self) -> None:
        """Forget the services (a later call through the actor fails with a KeyError)."""
        _OPEN.pop(self.key, None)


def open_gateway(services: dict[str, Service]) -> Gateway:
    """Spawn a gateway to `services` (looked up at each call: a service added later is served) in this process,
    from the controller's loop."""
    key = f"gateway-{next(_IDS)}"
    _OPEN[key] = (services, asyncio.get_running_loop())
    return Gateway(key, this_proc().spawn(key, ServiceGateway, key))
