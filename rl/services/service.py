"""A Service: N replicas of one actor behind a router; calls routed to one replica or sent to all, failed over.

    call ─▶ router (least outstanding, sticky by key) ─▶ replica ─▶ result
              ▲                                            │ died (Monarch supervision) / missed its deadline
              └──────── resubmit (same arguments, so the same sampling seed) ◀──┘   ─▶ lost: supervision replaces it

A lost replica's requests go to healthy replicas (at most `max_attempts` replicas per request). How replicas are
started, watched, lost and replaced is `rl.services.supervision`'s. Calls are typed from the actor's methods:
`service.endpoint(Generator.generate).route(requests, sampling)` takes what `Generator.generate` takes and returns
what it returns (torchforge's `ServiceEndpoint[P, R]` is the model).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import cached_property
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar

from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError
from monarch.actor import Endpoint

from rl.services.ledger import Ledger
from rl.services.router import Router
from rl.services.supervision import Replica, SupervisedReplicas, after_run_fault_hook

__all__ = ["NamedEndpoint", "RequestFailed", "Service", "ServiceEndpoint", "after_run_fault_hook"]

P = ParamSpec("P")
R = TypeVar("R")

_DIED, _DEADLINE = "its replica died", "its replica missed the call's deadline"


class RequestFailed(RuntimeError):
    """A request was lost on `max_attempts` replicas (or twice the same way: a poison request), or no replica
    became healthy in time. `timed_out`: its last replica missed the call's deadline."""

    def __init__(self, message: str, *, timed_out: bool = False):
        super().__init__(message)
        self.timed_out = timed_out


class ServiceEndpoint(Generic[P, R]):
    """One endpoint of a service's actor class, typed from the actor's method (`service.endpoint(Actor.method)`).

    `route(...)`: one replica answers (least outstanding, sticky by `key`), and the call is resubmitted if that
    replica is lost first. `fanout(...)`: every healthy replica answers within `timeout_s` (default: the service's
    `call_timeout_s`); one that fails, misses it, or whose answer `refuse` rejects is lost, not the call.
    `options(...)` gives the same endpoint with those set.
    """

    def __init__(
        self,
        service: Service,
        name: str,
        *,
        key: str | None = None,
        timeout_s: float | None = None,
        refuse: Callable[[R], str | None] | None = None,
    ):
        self.service, self.name, self.key, self.timeout_s, self.refuse = service, name, key, timeout_s, refuse

    def options(
        self,
        *,
        key: str | None = None,
        timeout_s: float | None = None,
        refuse: Callable[[R], str | None] | None = None,
    ) -> ServiceEndpoint[P, R]:
        return ServiceEndpoint(self.service, self.name, key=key, timeout_s=timeout_s, refuse=refuse)

    async def route(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return await self.service.call(self.name, *args, key=self.key, **kwargs)

    async def fanout(self, *args: P.args, **kwargs: P.kwargs) -> list[R]:
        timeout_s = self.service.config.call_timeout_s if self.timeout_s is None else self.timeout_s
        return await self.service.broadcast(self.name, *args, timeout_s=timeout_s, refuse=self.refuse, **kwargs)


class NamedEndpoint:
    """`service.<name>`: an endpoint found by its name, untyped, its options as keywords (`route(*args, key=...)`,
    `fanout(*args, timeout_s=..., refuse=...)`). A type checker cannot follow it: prefer `service.endpoint`."""

    def __init__(self, service: Service, name: str):
        self.service, self.name = service, name

    async def route(self, *args: Any, key: str | None = None) -> Any:
        return await self.service.call(self.name, *args, key=key)

    async def fanout(
        self, *args: Any, timeout_s: float, refuse: Callable[[Any], str | None] | None = None
    ) -> list[Any]:
        return await self.service.broadcast(self.name, *args, timeout_s=timeout_s, refuse=refuse)


class Service(SupervisedReplicas):
    """Calls to the replicas: routed to one (`call`) or sent to all (`broadcast`), counted, failed over. Built with
    `SupervisedReplicas`' arguments; its router and ledger start empty."""

    failed_requests = 0
    """Requests lost on `max_attempts` replicas (or no replica healthy in time)."""

    @cached_property
    def router(self) -> Router:
        """Picks a replica per call: least outstanding, sticky by key; counts what each replica served."""
        return Router(len(self.replicas))

    @cached_property
    def ledger(self) -> Ledger:
        """Each request's attempts, for resubmission and its counters."""
        return Ledger()

    def endpoint(self, method: Endpoint[P, R] | Callable[Concatenate[Any, P], Awaitable[R]]) -> ServiceEndpoint[P, R]:
        """The endpoint `method` of the service's actor class (`service.endpoint(Generator.generate)`), typed from it."""
        name = getattr(getattr(method, "_method", method), "__name__", None)
        if name is None or getattr(self.actor_class, name, None) is not method:
            raise TypeError(f"{method!r} is not an endpoint of {self.actor_class.__name__}")
        return ServiceEndpoint(self, name)

    def __getattr__(self, name: str) -> NamedEndpoint:
        """`service.generate`: the endpoint `generate` of the service's actor class; a name it lacks is an AttributeError here."""
        actor_class = self.__dict__.get("actor_class")
        if name.startswith("_") or not hasattr(actor_class, name):
            raise AttributeError(
                f"{type(self).__name__} {self.__dict__.get('name')!r}: {getattr(actor_class, '__name__', actor_class)} has no endpoint {name!r}"
            )
        return NamedEndpoint(self, name)

    async def call(self, endpoint: str, *args: Any, key: str | None = None, **kwargs: Any) -> Any:
        """`endpoint(*args)` on one replica; resubmitted to another if that one is lost before answering.

        Exceptions the endpoint raises itself are the caller's; `RequestFailed` after `max_attempts` lost replicas,
        or as soon as two replicas in a row were lost the same way on it (both died, or both missed the deadline):
        a poison request (one model reply that kills whatever scores it) is not handed to a third replica.
        """
        request = self.ledger.open()
        causes: list[str] = []
        try:
            while True:
                index = self.router.pick(await self._wait_healthy(), key)
                attempt = self.ledger.assign(request, index)
                try:
                    cause, result = await self._attempt(self.replicas[index], endpoint, args, kwargs)
                finally:
                    self.router.done(index)
                if cause is None:
                    return result
                causes.append(cause)
                poison = len(causes) >= 2 and causes[-1] == causes[-2]
                if poison or attempt >= self.config.max_attempts:
                    self.failed_requests += 1
                    why = (
                        f"the same way twice ({cause}): a poison request, not retried"
                        if poison
                        else f"({self.config_key}.max_attempts)"
                    )
                    raise RequestFailed(
                        f"{self.name}.{endpoint}: lost on {attempt} replicas {why}", timed_out=cause == _DEADLINE
                    )
        finally:
            self.ledger.close(request)

    async def _attempt(
        self, replica: Replica, endpoint: str, args: tuple, kwargs: dict[str, Any]
    ) -> tuple[str | None, Any]:
        """(how the replica was lost or None, result) of one call on `replica`, within `call_timeout_s`; a replica
        lost meanwhile ends it early."""
        call = asyncio.ensure_future(getattr(replica.actor, endpoint).call_one(*args, **kwargs))
        lost = asyncio.ensure_future(replica.lost.wait())
        try:
            done, _ = await asyncio.wait(
                {call, lost}, timeout=self.config.call_timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            if call in done:
                try:
                    return None, call.result()
                except SupervisionError as exc:
                    self.lose(replica, str(exc))
                    return _DIED, None
            if lost not in done:
                self.lose(
                    replica,
                    f"{endpoint} missed its deadline ({self.config_key}.call_timeout_s = {self.config.call_timeout_s})",
                )
                return _DEADLINE, None
            return _DIED, None
        finally:
            for future in (call, lost):
                future.cancel()

    async def _wait_healthy(self) -> list[int]:
        """The healthy replicas, waiting (at most `start_timeout_s`) while none is."""
        deadline = time.monotonic() + self.config.start_timeout_s
        while not (healthy := self.healthy):
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), max(deadline - time.monotonic(), 0))
            except TimeoutError:
                raise RequestFailed(f"{self.name}: no healthy replica for {self.config_key}.start_timeout_s") from None
        return healthy

    async def broadcast(
        self,
        endpoint: str,
        *args: Any,
        timeout_s: float,
        refuse: Callable[[Any], str | None] | None = None,
        **kwargs: Any,
    ) -> list[Any]:
        """`endpoint(*args)` on every healthy replica; one that fails or misses `timeout_s` is lost, not the call.

        `refuse(result)`: a reason to lose the replica that answered `result` (e.g. weights it could not prove it
        serves), or None; a refused replica is replaced like a dead one, and its answer is still returned."""

        async def one(replica: Replica) -> Any:
            try:
                result = await asyncio.wait_for(getattr(replica.actor, endpoint).call_one(*args, **kwargs), timeout_s)
            except (TimeoutError, SupervisionError) as exc:
                self.lose(
                    replica,
                    f"{endpoint} failed: {exc!r}" if str(exc) else f"{endpoint} missed its {timeout_s} s deadline",
                )
                return None
            if refuse is not None and (reason := refuse(result)) is not None:
                self.lose(replica, f"{endpoint} refused: {reason}")
            return result

        results = await asyncio.gather(*(one(self.replicas[index]) for index in self.healthy))
        return [result for result in results if result is not None]

    @contextlib.asynccontextmanager
    async def updating(self) -> AsyncIterator[None]:
        """Hold while updating every replica (a weight sync): a replacement runs `prepare` before or after, never during."""
        async with self._update_lock:
            yield

    def in_flight(self, index: int) -> int:
        return self.router.outstanding[index]

    def counters(self) -> dict[str, Any]:
        """What `metrics` counts since the run began: a checkpoint saves it, so a resumed run counts on."""
        return {
            "restarts": self.restarts,
            "resubmitted_requests": self.ledger.resubmitted,
            "failed_requests": self.failed_requests,
            "served": list(self.router.served),
        }

    def restore_counters(self, saved: dict[str, Any]) -> None:
        """Continue from a checkpoint's `counters` (added to what this launcher counted so far, e.g. at start-up)."""
        self.restarts += saved["restarts"]
        self.ledger.resubmitted += saved["resubmitted_requests"]
        self.failed_requests += saved["failed_requests"]
        self.router.served = [now + before for now, before in zip(self.router.served, saved["served"])]

    def metrics(self) -> dict[str, float]:
        """`services/<name>/...`: healthy replicas now; restarts, resubmitted and failed requests so far; requests per replica."""
        prefix = f"services/{self.name}"
        metrics = {
            f"{prefix}/healthy_replicas": len(self.healthy),
            f"{prefix}/restarts": self.restarts,
            f"{prefix}/resubmitted_requests": self.ledger.resubmitted,
            f"{prefix}/failed_requests": self.failed_requests,
        }
        metrics.update(
            {f"{prefix}/replica_{index}/requests": served for index, served in enumerate(self.router.served)}
        )
        return metrics
