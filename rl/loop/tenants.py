"""LoRA tenants: several LoRA runs on one base model sharing one generator engine and one trainer.

    rlmesh train --config a.toml --config b.toml
                  ┌ Controller a ─ TenantRoles a (reward service a) ┐        ┌ TenantGenerator: one vLLM engine, ┐
    launcher ─────┤                                                 ├─ tenant-keyed ─┤   one adapter slot per tenant     │
                  └ Controller b ─ TenantRoles b (reward service b) ┘   calls  └ TenantTrainer: one frozen base,      ┘
                                                                                  an adapter + optimizer per tenant

Each tenant is a whole run: its own `Controller` (run directory, data order, seeds, algorithm, rubric and reward
service, checkpoints, metrics, `--resume`), driven concurrently with the others in one asyncio loop. What its
controller asks of the trainer and the generators goes through tenant-keyed handles (`TenantHandle`,
`TenantService`) to the shared actors, which keep each tenant's adapter, optimizer, versions and metrics apart
(`actors.tenant_trainer`, `actors.tenant_generator`). A tenant that fails (its reward service, its breaker, a
non-finite step) stops alone; a shared actor's failure (the trainer, a generator the service cannot replace) stops
them all. What cannot be shared is refused by name before anything starts (`sharing_problems`).
"""

from __future__ import annotations

import asyncio
import functools
import re
from pathlib import Path
from typing import Any

from actors.tenant_generator import TenantGenerator
from actors.tenant_trainer import TenantSpec, TenantTrainer
from rl.config import Config
from rl.console import say
from rl.loop.controller import Controller
from rl.loop.resolve import resolve_config
from rl.loop.roles import Roles, refusal
from rl.processes.trainer_mesh import spawn_trainer
from rl.services.service import Service

SHARED_GENERATOR_KEYS = ("sampling", "eval_sampling")
"""`[generator]` keys a tenant may set its own way (they travel with each request); all others are one engine's."""

SHARED_TRAINER_KEYS = (
    "device",
    "dtype",
    "param_dtype",
    "attention",
    "cpus",
    "gradient_checkpointing",
    "num_procs",
    "num_hosts",
)
"""`[trainer]` keys of the one trainer process (a tenant's LoRA, optimizer, schedule and batch keys are its own)."""


def tenant_name(config: Config) -> str:
    """A tenant's name (its adapter's on the trainer and the generators): its `run.name`, as an identifier."""
    return re.sub(r"\W", "_", config.run.name)


def sharing_problems(configs: list[Config]) -> list[str]:
    """Why `configs` cannot run as tenants of one generator and one trainer: one line per key, naming it."""
    first, problems = configs[0], []
    names = [tenant_name(config) for config in configs]
    if len(set(names)) < len(names):
        problems.append(f"run.name: tenants need distinct names, got {[config.run.name for config in configs]}")
    for config, name in zip(configs, names):
        if not config.trainer.lora.enabled:
            problems.append(f"trainer.lora.enabled: tenant {name} is not a LoRA run (a full fine-tune owns its model)")
        if config.loss.kl_coef > 0:
            problems.append(f"loss.kl_coef: tenant {name} has a KL term (tenants have no reference model)")
        if config.models:
            problems.append(f"models: tenant {name} has frozen models ({', '.join(config.models)})")
        if config.weight_sync.transport != "shared_memory":
            problems.append(f"weight_sync.transport: tenant {name} uses {config.weight_sync.transport!r}")
    for config, name in zip(configs[1:], names[1:]):
        differ = []
        if config.model.path != first.model.path:
            differ.append("model.path")
        generator, first_generator = config.generator.model_dump(), first.generator.model_dump()
        differ += [
            f"generator.{key}"
            for key in generator
            if key not in SHARED_GENERATOR_KEYS and generator[key] != first_generator[key]
        ]
        differ += [
            f"trainer.{key}"
            for key in SHARED_TRAINER_KEYS
            if getattr(config.trainer, key) != getattr(first.trainer, key)
        ]
        for section in ("weight_sync", "cluster"):
            if getattr(config, section) != getattr(first, section):
                differ.append(section)
        if config.services.generator != first.services.generator:
            differ.append("services.generator")
        problems += [f"{key}: tenant {name} differs from tenant {names[0]} (one engine/trainer)" for key in differ]
    return problems


TRAINER_TENANT_ENDPOINTS = (
    "train_step",
    "push_weights",
    "save_checkpoint",
    "load_checkpoint",
    "logprobs",
    "metric_states",
)
"""The trainer endpoints that take the tenant (`tenant=`); the others (the process's memory, host, ping) are the shared
process's."""


class TenantHandle:
    """A tenant's view of the shared trainer: its tenant endpoints' calls carry `tenant=`."""

    def __init__(self, actor: Any, tenant: str):
        self._actor, self._tenant = actor, tenant

    def __getattr__(self, name: str) -> Any:
        if name in TRAINER_TENANT_ENDPOINTS:
            return _TenantCall(getattr(self._actor, name), self._tenant)
        return getattr(self._actor, name)


class _TenantCall:
    def __init__(self, endpoint: Any, tenant: str):
        self._endpoint, self._tenant = endpoint, tenant

    def call_one(self, *args: Any, **kwargs: Any) -> Any:
        return self._endpoint.call_one(*args, tenant=self._tenant, **kwargs)

    def call(self, *args: Any, **kwargs: Any) -> Any:
        return self._endpoint.call(*args, tenant=self._tenant, **kwargs)


TENANT_ENDPOINTS = ("generate", "update_weights", "prompt_logprobs")
"""The generator endpoints that take the tenant (as their last argument)."""


class TenantService:
    """A tenant's view of the shared generator service: its tenant endpoints carry the tenant; the rest is the
    service's (its counters are shared: a tenant's checkpoint does not restore them)."""

    def __init__(self, service: Service, tenant: str):
        self._service, self._tenant = service, tenant

    def __getattr__(self, name: str) -> Any:
        if name in TENANT_ENDPOINTS:
            return _TenantRoute(self._service, name, self._tenant)
        return getattr(self._service, name)

    def restore_counters(self, saved: dict[str, Any]) -> None:
        """The shared service's counters are not one tenant's to restore."""

    def handle_failure(self, failure: Any) -> bool:
        return False  # the shared roles' fault hook gives a generator's failure to the service itself

    async def stop(self) -> None:
        """The shared service outlives each tenant (`Tenants.run` stops it)."""


class AdapterRefused(RuntimeError):
    """A tenant's adapter did not prove its version on a shared generator: the tenant stops. The replica is not
    replaced: it serves the other tenants on, and only this tenant's lane on it is closed."""


class _TenantRoute:
    def __init__(self, service: Service, name: str, tenant: str):
        self._service, self._name, self._tenant = service, name, tenant

    async def route(self, *args: Any, key: str | None = None) -> Any:
        return await self._service.call(self._name, *args, self._tenant, key=key)

    async def fanout(self, *args: Any, timeout_s: float, refuse: Any = None) -> list[Any]:
        """The tenant's call on every healthy replica; a replica's answer that `refuse` names a reason for raises
        `AdapterRefused` (a solo run replaces such a replica; here that would stop every tenant's requests on it, and
        its replacement would load this tenant's unproven version again)."""
        results = await self._service.broadcast(self._name, *args, self._tenant, timeout_s=timeout_s)
        reasons = [reason for result in results if refuse is not None and (reason := refuse(result)) is not None]
        if reasons:
            raise AdapterRefused(f"tenant {self._tenant}: {self._name} refused on a shared generator: {reasons[0]}")
        return results


class SharedRoles(Roles):
    """The tenants' shared actors: the weight store, one generator service (`TenantGenerator`) and one trainer
    (`TenantTrainer`); no reward service (each tenant has its own)."""

    def __init__(self, config: Config, stop_run: Any):
        super().__init__(config, stop_run=stop_run, policy_version=lambda: 0)
        self.tenants: dict[str, TenantRoles] = {}

    async def start_shared(self, stop_token_ids: list[int], specs: dict[str, TenantSpec]) -> None:
        """Start the store, the generator service and the trainer for the tenants `specs` (by name)."""
        config = self.config
        await self._open()
        loras = {name: spec.trainer.lora for name, spec in specs.items()}
        self.generators = self._generator_service(TenantGenerator, stop_token_ids, loras)
        self._trainer_meshes.append("trainer")
        say(
            f"starting the tenants' trainer ({len(specs)} adapters on {config.model.path}) and "
            f"{config.generator.num_replicas} vLLM generator(s) with an adapter slot per tenant"
        )
        trainer = spawn_trainer(
            self.placement.spawn_procs,
            config.trainer,
            TenantTrainer,
            specs,
            config.model.path,
            mesh_name="trainer",
            weight_transport=config.weight_sync.transport,
            wire_dtype=config.generator.dtype,
        )
        (self.trainer, self._trainer_procs), _ = await asyncio.gather(trainer, self.generators.start())
        self._proc_meshes.append(self._trainer_procs)
        await asyncio.wait_for(self.trainer.initialized, config.services.generator.start_timeout_s)
        self.trainer_pids = sorted((await self.trainer.ping.call()).values())
        self._actors_ready = True

    def _on_actor_failure(self, failure: Any) -> None:
        """A tenant's reward replica goes to that tenant's service; anything else as `Roles._on_actor_failure` (a
        generator replica to the shared service, the trainer's failure stops every tenant)."""
        if not self._shutting_down and any(
            tenant.reward is not None and tenant.reward.handle_failure(failure) for tenant in self.tenants.values()
        ):
            return
        super()._on_actor_failure(failure)

    async def _load_policy(self, generator: Any) -> None:
        """A replacement generator loads every tenant's current version (each proven when its tenant attests)."""
        for name, tenant in self.tenants.items():
            if (policy_version := tenant.policy_version()) > 0:
                update = await generator.update_weights.call_one(policy_version, tenant.published, name)
                if (reason := refusal(update)) is not None:
                    raise RuntimeError(f"tenant {name}: {reason}")


class TenantRoles(Roles):
    """One tenant's roles: its own reward service; the trainer and the generators are the shared ones, reached
    through tenant-keyed handles."""

    def __init__(self, config: Config, stop_run: Any, policy_version: Any, *, shared: SharedRoles, tenant: str):
        super().__init__(config, stop_run=stop_run, policy_version=policy_version)
        self.shared, self.tenant = shared, tenant
        shared.tenants[tenant] = self

    async def start(self, stop_token_ids: list[int], planned_steps: int) -> None:
        """The tenant's reward service; the shared actors are already running."""
        shared = self.shared
        self.run_log = shared.run_log
        self.trainer = TenantHandle(shared.trainer, self.tenant)
        self.generators = TenantService(shared.generators, self.tenant)
        self.trainer_pids = shared.trainer_pids
        self.reward = self._reward_service(f"reward_{self.tenant}", shared.placement)  # the hosts are the shared run's
        await self.reward.start()
        self._actors_ready = True

    async def restart_trainer(self) -> None:
        raise RuntimeError("a tenants' trainer is not replaced inside the run: resume the tenants instead")

    async def stop(self) -> None:
        """Stop the tenant's reward service (the shared actors are stopped once every tenant has ended)."""
        if self.reward is not None:
            await asyncio.gather(self.reward.stop(), return_exceptions=True)


class Tenants:
    """Several LoRA runs as tenants of one generator engine and one trainer (module docstring)."""

    def __init__(self, configs: list[Config], resume_from: list[Path | None]):
        """`configs`: each tenant's config (resolved here), `resume_from`: each one's checkpoint or None. Raises
        ValueError naming every key that cannot be shared."""
        self.shared = SharedRoles(resolve_config(configs[0]), stop_run=self._stop_all)
        controllers = []
        for config, resume in zip(configs, resume_from, strict=True):
            roles = functools.partial(TenantRoles, shared=self.shared, tenant=tenant_name(config))
            controller = Controller(config, resume_from=resume, roles_class=roles)
            controller.recovery.budget = 0  # a lost shared trainer stops every tenant (resume them)
            controllers.append(controller)
        problems = sharing_problems([controller.config for controller in controllers])
        if len({tuple(controller.stop_token_ids) for controller in controllers}) > 1:
            problems.append("tasks: the tenants' renderers stop on different tokens (one engine's stop tokens)")
        if problems:
            raise ValueError(
                "these configs cannot run as tenants of one base:\n" + "\n".join(f"  {p}" for p in problems)
            )
        self.controllers = {tenant_name(controller.config): controller for controller in controllers}

    def _stop_all(self, message: str) -> None:
        """A shared actor failed: every tenant stops with `message`."""
        for controller in self.controllers.values():
            controller.stop_run(message)

    def specs(self) -> dict[str, TenantSpec]:
        return {
            name: TenantSpec(controller.config.trainer, controller.config.loss, controller.planned_steps)
            for name, controller in self.controllers.items()
        }

    async def start(self) -> None:
        first = next(iter(self.controllers.values()))
        await self.shared.start_shared(first.stop_token_ids, self.specs())

    async def run(self) -> dict[str, dict[str, Any] | BaseException]:
        """Every tenant's whole run, concurrently; each one's summary, or what ended it."""
        try:
            await self.start()
            results = await asyncio.gather(
                *(controller.run() for controller in self.controllers.values()), return_exceptions=True
            )
        finally:
            await self.shared.stop()
        return dict(zip(self.controllers, results))
