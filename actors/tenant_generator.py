"""TenantGenerator: one vLLM engine on the shared base model serving one LoRA adapter slot per tenant.

Every endpoint names its tenant (`rl.loop.tenants`). A tenant's sync pulls the adapter its publisher wrote under the
tenant's namespace, writes it as a PEFT folder of the tenant's own, loads it under an adapter id no other tenant or
version has, and pauses only that tenant's lane of the engine (`actors.tenant_engine`); with attestation, the replica
measures the adapter in that id's slot against that tenant's fingerprints and the version that tenant's lane stamps.
A tenant's requests carry only its own adapter, so a tenant never samples another's. A tenant's adapter that is not
finite is not loaded (`NonFiniteAdapter`): vLLM's CPU LoRA ops give the requests of every adapter NaN logprobs once one
slot holds a NaN or an infinity.
"""

from __future__ import annotations

import asyncio
import functools
import time
from pathlib import Path

import torch
from monarch.actor import concurrent_endpoint

from actors.generator import AttestationFailed, Generator, WeightUpdate, attest_adapter, reload_proven
from actors.tenant_engine import TenantEngineLoop
from actors.tenant_trainer import weights_namespace
from rl.config.lora import LoraConfig
from rl.config.roles import GeneratorConfig, SamplingConfig
from rl.processes.heap import return_free_heap_pages
from rl.services.replica import ReplicaId
from rl.weights.adapter import AdapterFolders, lora_request_id
from rl.weights.attestation import Fingerprints
from rl.weights.shared_file import MappedFiles
from rl.weights.sync import WeightReceiver
from rollouts.types import Completion, GenerationFailed, GenerationRequest

VERSIONS_PER_TENANT = 10_000_000
"""vLLM adapter ids of tenant i are i * VERSIONS_PER_TENANT + `lora_request_id(version)`: distinct across tenants."""


class NonFiniteAdapter(RuntimeError):
    """A tenant's adapter holds a NaN or an infinity: loading it would spoil every tenant's sampling on the engine, so
    the tenant's sync fails (and the tenant stops) instead."""


class TenantGenerator(Generator):
    """One replica of the tenants' generator service."""

    def __init__(
        self,
        generator_config: GeneratorConfig,
        model_path: str,
        weight_transport: str,
        stop_token_ids: list[int],
        replica: ReplicaId | None,
        loras: dict[str, LoraConfig],
    ):
        """`loras`: each tenant's `[trainer.lora]`, by tenant name."""
        self.loras = loras
        self.tenant_index = {tenant: index for index, tenant in enumerate(loras)}
        widest = max(loras.values(), key=lambda lora: lora.rank)
        super().__init__(
            generator_config, model_path, weight_transport, stop_token_ids, replica, widest, lora_slots=len(loras)
        )

    def _adapter_folders(self, lora: LoraConfig | None, base: str) -> None:
        """Each tenant's adapters are written in folders of its own (`tenant_adapters`); there is no one policy's."""
        self.tenant_adapters = {tenant: AdapterFolders(lora, base) for tenant, lora in self.loras.items()}

    def _engine_loop(self) -> TenantEngineLoop:
        return TenantEngineLoop(self.llm.llm_engine, list(self.loras))

    def _weight_receiver(self, weight_transport: str) -> WeightReceiver:
        """Adapters travel whole under each tenant's namespace, never as deltas (`rl.weights.delta.sends_deltas`)."""
        return WeightReceiver(weight_transport)

    def _adapter_ids(self, tenant: str) -> range:
        """The vLLM adapter ids of `tenant`'s versions."""
        first = self.tenant_index[tenant] * VERSIONS_PER_TENANT
        return range(first, first + VERSIONS_PER_TENANT)

    @concurrent_endpoint
    async def generate(
        self, requests: list[GenerationRequest], sampling: SamplingConfig, tenant: str = ""
    ) -> list[Completion | GenerationFailed]:
        """`Generator.generate` for `tenant`: each request runs with the tenant's adapter."""
        return await self._generate_all(requests, sampling, self.engine.lanes[tenant])

    @concurrent_endpoint
    async def update_weights(
        self, policy_version: int, expected: Fingerprints | None = None, tenant: str = ""
    ) -> WeightUpdate:
        """`Generator.update_weights` for `tenant`'s adapter: the other tenants keep sampling meanwhile."""
        from vllm.lora.request import LoRARequest

        start = time.perf_counter()
        lane, folders = self.engine.lanes[tenant], self.tenant_adapters[tenant]
        handle = await self.weights.pull(policy_version, weights_namespace(tenant))
        state_dict = MappedFiles().state_dict(handle)
        if nonfinite := [name for name, tensor in state_dict.items() if not torch.isfinite(tensor).all()]:
            raise NonFiniteAdapter(
                f"tenant {tenant}'s adapter of policy version {policy_version} is not finite ({len(nonfinite)} tensors, "
                f"{nonfinite[0]} first); it is not loaded: vLLM's CPU LoRA ops would give every tenant's requests NaN"
            )
        folder = await asyncio.to_thread(folders.write, policy_version, state_dict)
        adapter_id = self._adapter_ids(tenant).start + lora_request_id(policy_version)
        adapter = LoRARequest(f"{tenant}-v{policy_version}", adapter_id, str(folder))
        load = functools.partial(self._load_adapter, adapter, own=self._adapter_ids(tenant))
        slot = {"lora_int_id": adapter_id, "scaling": folders.scaling, "lane": lane}
        prove = functools.partial(attest_adapter, self.engine, self.llm, expected, **slot)
        try:
            verdict = await reload_proven(
                self.engine,
                self.on_weight_update,
                policy_version,
                load,
                None if expected is None else prove,
                adapter,
                lane,
            )
        except AttestationFailed as refused:  # the tenant's lane stays closed; the other tenants' serve on
            return WeightUpdate(time.perf_counter() - start, refused.verdict)
        folders.keep_only(Path(adapter.lora_path))
        return_free_heap_pages()
        return WeightUpdate(time.perf_counter() - start, verdict)

    @concurrent_endpoint
    async def prompt_logprobs(self, token_ids: list[int], tenant: str = "") -> list[float]:
        """Logprob of each token given its prefix under `tenant`'s adapter (position 0 gets 0.0)."""
        return await self._prompt_logprobs(token_ids, self.engine.lanes[tenant])

    @concurrent_endpoint
    async def shutdown(self) -> None:
        for folders in self.tenant_adapters.values():
            folders.close()
        await Generator.shutdown._method(self)
