"""TenantTrainer: one frozen base model, one LoRA adapter, optimizer and LR schedule per tenant (`rl.loop.tenants`).

Every endpoint names its tenant: peft's active adapter becomes that tenant's (`set_adapter`: its adapter alone is
applied and trainable), and the call runs as `PolicyTrainer`'s would on a model holding that adapter alone: the same
`train_step`, the same PEFT tensor names in each sync (the adapter name is stripped), the same checkpoint contents
(the adapter's parameters, named after the tenant, and its optimizer). Each tenant publishes its versions under its own
namespace (`rl.weights.sync.WeightPublisher`), and the metrics recorded during its calls are kept apart and handed
to its own controller only.

A tenant's adapter is initialised from `torch.manual_seed(trainer.seed)`, as a solo run's is (loading the base model
draws no random numbers), so tenant and solo runs start from the same adapter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from monarch.actor import endpoint
from tensordict import TensorDict

from actors.trainer import load_causal_lm
from rl.checkpoint import store as checkpoint
from rl.config.loss import LossConfig
from rl.config.roles import TrainerConfig
from rl.config.section import DType
from rl.metrics.actor import MetricsActor
from rl.metrics.reduce import Reduce, State, drain_states, merge_all, record_metric
from rl.precision import TORCH_DTYPES, compute_context
from rl.processes.affinity import pin_process
from rl.processes.titles import name_process
from rl.services.replica import ServiceReplica
from rl.training import lora
from rl.training.distributed import Ranks
from rl.training.logprobs import token_logprobs
from rl.training.schedule import lr_lambda
from rl.training.train_step import train_step
from rl.weights import sync as weight_sync
from rl.weights.attestation import Fingerprints


@dataclass(frozen=True)
class TenantSpec:
    """What the trainer needs of one tenant: its `[trainer]` (LoRA, optimizer, schedule), its loss, and the optimizer
    steps its LR schedule is sized for."""

    trainer: TrainerConfig
    loss: LossConfig
    total_steps: int


@dataclass
class Tenant:
    """One tenant's part of the trainer."""

    spec: TenantSpec
    optimizer: torch.optim.Optimizer
    scheduler: Any
    publisher: weight_sync.WeightPublisher
    states: list[dict[str, State]] = field(default_factory=list)
    """Metrics recorded during this tenant's calls, not yet handed over."""


def weights_namespace(tenant: str) -> str:
    """The store-key and file prefix of `tenant`'s published versions."""
    return f"tenant-{tenant}-"


class TenantTrainer(MetricsActor, ServiceReplica):
    """The tenants' shared trainer (one rank): the base model once, an adapter per tenant."""

    def __init__(self, tenants: dict[str, TenantSpec], model_path: str, *, weight_transport: str, wire_dtype: DType):
        """`tenants`: adapter name -> its spec, in the order their adapters are created (the first tenant's
        `[trainer]` decides the shared settings: device, dtypes, attention, pinning, which `rl.loop.tenants` checks are
        equal across tenants)."""
        first = next(iter(tenants.values())).trainer
        pin_process(first.cpus, rank=0, of=1)
        name_process("trainer/tenants")
        self.trainer_config = first
        self.device = torch.device(first.device)
        self.wire_dtype = TORCH_DTYPES[wire_dtype]
        self.ranks = Ranks.single()
        base = load_causal_lm(model_path, first)
        if first.gradient_checkpointing:  # a reentrant checkpoint of frozen inputs gives no gradient
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self.lm: Any = None
        self.tenants: dict[str, Tenant] = {}
        for name, spec in tenants.items():
            torch.manual_seed(spec.trainer.seed)  # the solo run's seed before its adapters are made
            if self.lm is None:
                self.lm = lora.with_adapters(base, spec.trainer.lora, adapter_name=name)
            else:
                self.lm.add_adapter(name, lora.peft_config(spec.trainer.lora))
            parameters = [p for n, p in self.lm.named_parameters() if f".{name}." in n and "lora_" in n]
            optimizer = torch.optim.AdamW(
                parameters, lr=spec.trainer.lr, betas=spec.trainer.betas, weight_decay=spec.trainer.weight_decay
            )
            steps = spec.total_steps * spec.trainer.ppo_n_minibatches  # one LR step per optimizer step
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(spec.trainer, steps))
            publisher = weight_sync.WeightPublisher(weight_transport, namespace=weights_namespace(name))
            self.tenants[name] = Tenant(spec, optimizer, scheduler, publisher)
        self.lm.train()

    def _use(self, tenant: str) -> Tenant:
        """`tenant`'s adapter active (the only one applied and trainable); what was recorded before goes to the
        tenant it was recorded for."""
        if tenant not in self.tenants:
            raise KeyError(f"no tenant {tenant!r} on this trainer (tenants: {', '.join(self.tenants)})")
        self.lm.set_adapter(tenant)
        return self.tenants[tenant]

    def _keep_metrics(self, tenant: Tenant) -> None:
        """The metrics recorded during the call just made belong to `tenant`."""
        if states := drain_states():
            tenant.states.append(states)

    def _compute(self, spec: TenantSpec):
        return compute_context(spec.trainer.device, spec.trainer.param_dtype, spec.trainer.dtype)

    @endpoint
    async def train_step(self, micro_batches: list[TensorDict], tenant: str) -> dict[str, float]:
        """`PolicyTrainer.train_step` on `tenant`'s adapter and optimizer."""
        state = self._use(tenant)
        spec = state.spec
        try:
            return train_step(
                self.lm,
                state.optimizer,
                state.scheduler,
                micro_batches,
                spec.loss,
                max_grad_norm=spec.trainer.max_grad_norm,
                horizon=spec.trainer.seq_len,
                n_minibatches=spec.trainer.ppo_n_minibatches,
                reference=None,
                device=self.device,
                compute=lambda: self._compute(spec),
                ranks=self.ranks,
            )
        finally:
            state.optimizer.zero_grad(set_to_none=True)  # no stale gradient in another tenant's clipping norm
            self._keep_metrics(state)

    @endpoint
    async def push_weights(
        self, policy_version: int, fingerprint: bool = False, full: bool = False, *, tenant: str
    ) -> Fingerprints | None:
        """`tenant`'s adapter published as its `policy_version` (PEFT's saved names, as a solo LoRA run's). An adapter
        always travels whole (never as a delta), so `full` (`PolicyTrainer.push_weights`'s repair of a delta) changes
        nothing."""
        state = self._use(tenant)
        state_dict = lora.adapter_state_dict(self.lm, adapter_name=tenant)
        try:
            fingerprints = await state.publisher.publish(
                state_dict, policy_version, self.wire_dtype, self.ranks, fingerprint=fingerprint
            )
            record_metric("weight_sync/bytes", weight_sync.payload_bytes(state_dict, self.wire_dtype), Reduce.MAX)
        finally:
            self._keep_metrics(state)
        return fingerprints

    @endpoint
    async def release_weights(self) -> None:
        """Free every tenant's published weights (before the process is stopped)."""
        for state in self.tenants.values():
            state.publisher.close()

    @endpoint
    async def save_checkpoint(self, path: str, weights_only: bool = False, *, tenant: str) -> None:
        """`tenant`'s adapter (its trainable parameters), optimizer, LR schedule and the process's RNG into `path`."""
        state = self._use(tenant)
        checkpoint.save_trainer_rank(Path(path), self.lm, state.optimizer, state.scheduler, 0, weights_only)

    @endpoint
    async def load_checkpoint(self, path: str, *, tenant: str) -> None:
        state = self._use(tenant)
        checkpoint.load_trainer_rank(Path(path), self.lm, state.optimizer, state.scheduler)

    @endpoint
    async def logprobs(self, token_ids: list[int], reference: bool = False, *, tenant: str) -> list[float] | None:
        """Logprob of each token given its prefix under `tenant`'s policy (position 0 gets 0.0); tenants have no
        reference model (`rl.loop.tenants` refuses a KL term)."""
        if reference:
            return None
        state = self._use(tenant)
        input_ids = torch.tensor([token_ids], device=self.device)
        position_ids = torch.arange(len(token_ids), device=self.device).unsqueeze(0)
        self.lm.eval()
        try:
            with torch.no_grad(), self._compute(state.spec):
                return token_logprobs(self.lm, input_ids, position_ids)[0].tolist()
        finally:
            self.lm.train()

    @endpoint
    async def metric_states(self, tenant: str) -> dict[str, State]:
        """What `tenant`'s calls recorded since the last call (and forget it)."""
        state = self.tenants[tenant]
        states, state.states = merge_all(state.states), []
        return states
