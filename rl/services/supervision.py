"""Supervision of a service's replicas: each started in its own one-process mesh, watched, and replaced when lost.

Monarch cannot respawn one process of a mesh, so every replica owns a one-process mesh. A lost
replica is known from Monarch's supervision (`handle_failure`, a `SupervisionError` on a call),
from its process's exit (on this host, checked every `probe_interval_s`), from a call that misses
`call_timeout_s`, or from an unanswered ping (busy replicas too: `ping` is a concurrent endpoint, so it
does not queue behind their work; a process that stops answering is seen within `probe_timeout_s`
rather than at the end of a long call's deadline). A replacement is spawned, runs `prepare` (e.g. loads
the current policy weights) and only then takes traffic. Replacements beyond `max_restarts` per
`restart_window_s`, or fewer than `min_healthy_replicas` replicas healthy or being replaced, end the run
through `on_fatal`. Routing calls to the replicas is `rl.services.service`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import re
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import psutil
from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError

from rl.config.services import ServiceConfig
from rl.console import say, warn
from rl.services.replica import ReplicaId, SpawnProcs

_SERVICES = itertools.count()


@dataclass
class Replica:
    id: ReplicaId
    procs: Any
    actor: Any
    pid: int | None = None
    process: psutil.Process | None = None
    """The replica's process when it is a child of this one (one host): its exit is seen without waiting for Monarch."""
    healthy: bool = False
    lost: asyncio.Event = field(default_factory=asyncio.Event)
    lost_at: float = 0.0
    probing: bool = False
    """A ping is outstanding (the next one waits for it: probes never pile up on a slow replica)."""


class SupervisedReplicas:
    """The replicas of one actor class: started, probed, lost and replaced, stopped."""

    def __init__(
        self,
        name: str,
        actor_class: type,
        args: Callable[[ReplicaId], tuple],
        *,
        replicas: int,
        config: ServiceConfig,
        spawn_procs: SpawnProcs,
        on_fatal: Callable[[str], None],
        prepare: Callable[[Any], Awaitable[None]] | None = None,
        config_key: str | None = None,
        release: str | None = None,
    ):
        """`args(replica_id)`: the actor's constructor arguments; `prepare(actor)`: runs before a replacement takes traffic.

        `config_key`: where `config` sits in the run's config, for messages (default `services.<name>`);
        `release`: an endpoint `stop` calls on every healthy replica first (e.g. to free an engine).
        """
        self.release = release
        self.name = name
        self.config_key = config_key or f"services.{name}"
        self.actor_class = actor_class
        self.args = args
        self.config = config
        self.spawn_procs = spawn_procs
        self.on_fatal = on_fatal
        self.prepare = prepare
        self.replicas: list[Replica | None] = [None] * replicas
        self.restarts = 0
        """Replacements started (what `max_restarts` counts)."""
        self.losses: list[str] = []
        """Every lost replica with the reason, e.g. "generator/0#0: generate missed its deadline (...)"."""
        self.recoveries: list[tuple[float, float]] = []
        """Per replacement: (`time.monotonic()` of the replica's loss, of its replacement taking traffic)."""
        self._restart_times: list[float] = []
        self.replacing: set[int] = set()
        """Slots whose lost replica is being stopped and replaced."""
        self._changed = asyncio.Event()
        self._update_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._context: contextvars.Context | None = None
        self._by_mesh: dict[str, Replica] = {}  # every replica ever spawned (old ones too), by actor mesh name
        # in mesh names: a late report about an earlier run's replica never matches a live one
        self._serial = next(_SERVICES)

    async def start(self) -> None:
        """Spawn every replica (each within `start_timeout_s`), then keep probing them."""
        self._loop = asyncio.get_running_loop()
        self._context = contextvars.copy_context()  # Monarch's actor context: spawning a replacement needs it
        await asyncio.gather(*(self._start_replica(ReplicaId(self.name, index)) for index in range(len(self.replicas))))
        self._spawn_task(self._probe_forever())

    async def _start_replica(self, replica_id: ReplicaId, prepare: bool = False) -> None:
        procs = self.spawn_procs(replica_id.index)
        mesh = f"{self.name}_{replica_id.index}_{replica_id.incarnation}_s{self._serial}"
        replica = Replica(replica_id, procs, procs.spawn(mesh, self.actor_class, *self.args(replica_id)))
        actor = replica.actor
        self._by_mesh[mesh] = replica
        self.replicas[replica_id.index] = replica
        try:
            async with asyncio.timeout(self.config.start_timeout_s):
                await actor.initialized
                replica.pid = await actor.ping.call_one()
                replica.process = _descendant(replica.pid)
                if prepare and self.prepare is not None:
                    async with self._update_lock:  # not while an update is half-way through the healthy replicas
                        await self.prepare(actor)
        except BaseException:
            await self._stop_procs(replica)
            raise
        replica.healthy = True
        self._changed.set()

    @property
    def healthy(self) -> list[int]:
        return [replica.id.index for replica in self.replicas if replica is not None and replica.healthy]

    def actors(self) -> list[Any]:
        """The healthy replicas' actors (for calls that are not requests, e.g. gathering metric states)."""
        return [self.replicas[index].actor for index in self.healthy]

    def handle_failure(self, failure: Any) -> bool:
        """Monarch's report of a failed mesh (any thread): True if it was one of this service's replicas (lost already or not).

        A replica of an earlier service of the same name in this process (stopped, reported late) counts as handled too.
        """
        replica = self._by_mesh.get(failure.mesh_name.rpartition("-")[0])  # Monarch appends "-<id>" to the name given
        if (
            replica is not None and self._loop is not None
        ):  # not in Monarch's thread's context: `this_host()` fails there
            self._loop.call_soon_threadsafe(self.lose, replica, failure.report(), context=self._context)
        return self.owns(failure)

    def owns(self, failure: Any) -> bool:
        """Whether Monarch's failure report is about a replica of this service (or of an earlier one of its name)."""
        return re.fullmatch(rf"{re.escape(self.name)}_\d+_\d+_s\d+", failure.mesh_name.rpartition("-")[0]) is not None

    def lose(self, replica: Replica, reason: str) -> None:
        """Take `replica` out of routing, fail over its requests, and replace it if the restart budget allows (once per replica)."""
        if replica.lost.is_set() or self.replicas[replica.id.index] is not replica:
            return
        index = replica.id.index
        replica.healthy, replica.lost_at = False, time.monotonic()
        replica.lost.set()
        self.losses.append(f"{replica.id}: {reason.strip()[:500]}")
        warn(f"{self.name} replica {replica.id} lost: {reason.strip()[:500]}")
        self._restart_times = [t for t in self._restart_times if replica.lost_at - t < self.config.restart_window_s]
        if len(self._restart_times) >= self.config.max_restarts:
            self._spawn_task(self._stop_procs(replica))
            self._check_capacity(
                index,
                f"{self.name}: restart budget spent ({self.config_key}.max_restarts = {self.config.max_restarts} "
                f"within restart_window_s = {self.config.restart_window_s})",
            )
            return
        self._restart_times.append(replica.lost_at)
        self.restarts += 1
        self.replacing.add(index)
        self._spawn_task(self._replace(replica))

    async def _replace(self, old: Replica) -> None:
        index = old.id.index
        try:
            await self._stop_procs(old)
            stopped_at = time.monotonic()
            try:
                await self._start_replica(ReplicaId(self.name, index, old.id.incarnation + 1), prepare=True)
            except Exception as exc:
                self._check_capacity(index, f"{self.name}: replacement of replica {old.id} failed to start: {exc!r}")
                return
            self.recoveries.append((old.lost_at, time.monotonic()))
            say(
                f"{self.name} replica {index} replaced; serving again {time.monotonic() - old.lost_at:.1f} s after the loss "
                f"(stopping the old one: {stopped_at - old.lost_at:.1f} s)"
            )
        finally:
            self.replacing.discard(index)

    def _check_capacity(self, index: int, cause: str) -> None:
        """Slot `index` stays empty: stop the run if too few replicas are left (healthy or being replaced)."""
        alive = len(set(self.healthy) | (self.replacing - {index}))
        warn(cause)
        if alive < self.config.min_healthy_replicas:
            self.on_fatal(
                f"{cause}; {alive} replicas left, fewer than {self.config_key}.min_healthy_replicas = "
                f"{self.config.min_healthy_replicas}"
            )

    async def _probe_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.probe_interval_s)
            for index in self.healthy:
                replica = self.replicas[index]
                if replica.process is not None and not _alive(replica.process):
                    self.lose(replica, f"its process {replica.pid} exited")
                elif not replica.probing:
                    replica.probing = True
                    self._spawn_task(self._probe(replica))

    async def _probe(self, replica: Replica) -> None:
        """Ping `replica`, idle or busy; lose it if the ping fails or goes unanswered for `probe_timeout_s`."""
        busy = self.in_flight(replica.id.index)
        try:
            await asyncio.wait_for(replica.actor.ping.call_one(), self.config.probe_timeout_s)
        except (TimeoutError, SupervisionError) as exc:
            self.lose(replica, f"health probe failed ({busy} requests in flight): {exc!r}")
        finally:
            replica.probing = False

    async def _stop_procs(self, replica: Replica) -> None:
        """Stop the replica's mesh; a process that does not exit in time (a hung one) is killed by pid."""
        try:
            await asyncio.wait_for(replica.procs.stop(), 8)
        except Exception:
            pass
        if replica.process is not None and _alive(replica.process):
            with contextlib.suppress(psutil.Error):
                replica.process.kill()

    def _spawn_task(self, coroutine: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def in_flight(self, index: int) -> int:
        """Calls outstanding on replica `index` (for the loss message of a probe); the router's count in a Service."""
        return 0

    async def stop(self) -> None:
        """Stop probing and replacing, call `release` on every healthy replica, stop every mesh."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        replicas = [replica for replica in self.replicas if replica is not None]
        if self.release is not None:
            calls = [
                asyncio.wait_for(getattr(self.replicas[index].actor, self.release).call_one(), 10)
                for index in self.healthy
            ]
            await asyncio.gather(*calls, return_exceptions=True)
        for replica in replicas:
            replica.healthy = False
        await asyncio.gather(*(self._stop_procs(replica) for replica in replicas), return_exceptions=True)
        self.replicas = [None] * len(self.replicas)


def _descendant(pid: int) -> psutil.Process | None:
    """This process's descendant `pid`, or None (a replica on another host)."""
    return next((child for child in psutil.Process().children(recursive=True) if child.pid == pid), None)


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def after_run_fault_hook(
    services: list[SupervisedReplicas], previous: Callable[[Any], None], stopped_meshes: Collection[str] = ()
) -> Callable[[Any], None]:
    """Monarch's fault hook once a run has stopped: reports of its stopped replicas and of the other meshes it stopped
    (`stopped_meshes`, by name without Monarch's "-<id>": the trainer's) are dropped, since Monarch may deliver them
    late (e.g. "Killed(sig=15)" from the stop itself, on a busy machine after the run has returned); any other goes to
    `previous`."""

    def hook(failure: Any) -> None:
        mesh = failure.mesh_name.rpartition("-")[0]
        if failure.mesh_name.startswith("logger-") or mesh in stopped_meshes:
            return
        if not any(service.owns(failure) for service in services):
            previous(failure)

    return hook
