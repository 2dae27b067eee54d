"""Fakes of Monarch proc meshes and actors for the service tests."""

import asyncio
from dataclasses import dataclass
from types import SimpleNamespace

from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError

from rl.config.services import ServiceConfig
from rl.services.service import Service


class FakeActor:
    """A replica: `generate(x)` answers `(incarnation name, x)`, or hangs / dies as the test scripts it; `update(v)`
    answers v, or hangs, or answers v - 1 ("stale")."""

    def __init__(self, name: str, script: dict):
        self.name = name
        self.script = script
        self.calls: list[tuple] = []
        self.initialized = asyncio.sleep(0)
        self.ping = SimpleNamespace(call_one=self._ping)
        self.generate = SimpleNamespace(call_one=self._generate)
        self.update = SimpleNamespace(call_one=self._update)

    async def _ping(self):
        if self.script.get("ping") == "hang":
            await asyncio.Event().wait()
        return 10**7  # no such child process: the service's kill-by-pid leaves it alone

    async def _generate(self, x):
        self.calls.append(("generate", x))
        behaviour = self.script.get("generate")
        if behaviour == "hang":
            await asyncio.Event().wait()
        if behaviour == "die":
            raise SupervisionError(f"{self.name}: the process this actor was running on failed: Killed(sig=9)")
        return self.name, x

    async def _update(self, version):
        self.calls.append(("update", version))
        if self.script.get("update") == "hang":
            await asyncio.Event().wait()
        if self.script.get("update") == "stale":
            return version - 1
        return version


class FakeHost:
    """`spawn_procs(index)`: a fake one-process mesh; `scripts[name]` scripts the actor spawned under `name`."""

    def __init__(self, scripts: dict | None = None):
        self.scripts = scripts or {}
        self.actors: dict[str, FakeActor] = {}
        self.stopped: list[str] = []

    def spawn_procs(self, index: int):
        host = self

        class Procs:
            name = None

            def spawn(self, name, actor_class, *args):
                name = name.rpartition("_s")[0]  # drop the service's serial number
                self.name = name
                host.actors[name] = FakeActor(name, host.scripts.get(name, {}))
                return host.actors[name]

            async def stop(self):
                host.stopped.append(self.name)

        return Procs()


@dataclass
class Failure:
    mesh_name: str

    def report(self) -> str:
        return f"{self.mesh_name}: the process this actor was running on failed: Killed(sig=9)"


def make_service(host: FakeHost, replicas: int = 2, fatal: list | None = None, prepare=None, **config) -> Service:
    return Service(
        "generator",
        FakeActor,
        lambda replica: (),
        replicas=replicas,
        config=ServiceConfig(**{"call_timeout_s": 5.0, "probe_interval_s": 3600.0, **config}),
        spawn_procs=host.spawn_procs,
        on_fatal=(fatal if fatal is not None else []).append,
        prepare=prepare,
    )


async def settle(service: Service) -> None:
    """Let the replacement tasks run to completion."""
    while service.replacing:
        await asyncio.sleep(0.01)
