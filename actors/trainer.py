"""PolicyTrainer: a transformers causal LM, its optimizer, and the push of its weights.

The controller hands it a batch of packed `[B, L]` rows as micro-batches; `rl.training.train_step` runs
the update (K optimizer steps, each normalized by its global per-component token counts), then
the trainer publishes the new weights to torchstore under the next policy version.

With `trainer.num_procs * trainer.num_hosts > 1` it is a proc mesh of ranks acting as one (`rl.processes.trainer_mesh`):
each rank holds an FSDP2 shard of the model (`rl.training.distributed`), trains on its share of the rows, and every
endpoint runs on every rank.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from monarch.actor import current_rank, endpoint
from tensordict import TensorDict
from transformers import AutoConfig, AutoModelForCausalLM

from rl.assets import resolve_model_path
from rl.checkpoint import store as checkpoint
from rl.config.loss import LossConfig
from rl.config.roles import TrainerConfig
from rl.config.section import DType
from rl.metrics.actor import MetricsActor
from rl.metrics.memory import MIB, peak_rss_bytes, reset_peaks, rss_bytes
from rl.metrics.reduce import Reduce, record_metric
from rl.packing.attention_kinds import prefix_sharing_refusal
from rl.precision import TORCH_DTYPES, compute_context, computes_on_a_copy
from rl.processes.affinity import pin_process
from rl.processes.heap import return_free_heap_pages, return_large_blocks_to_the_system
from rl.processes.titles import name_process
from rl.services.replica import ServiceReplica
from rl.training import distributed, lora
from rl.training.compute_copy import ComputeCopy
from rl.training.logprobs import token_logprobs
from rl.training.schedule import lr_lambda
from rl.training.sharded_load import load_shards
from rl.training.train_step import train_step
from rl.weights import sync as weight_sync
from rl.weights.attestation import Fingerprints
from rl.weights.delta import DeltaMode, sends_deltas
from rl.weights.delta_sync import DeltaPublisher


def load_causal_lm(path: str, trainer_config: TrainerConfig, empty: bool = False) -> torch.nn.Module:
    """The model at `path` (`empty`: built on the meta device, nothing allocated or read: a sharded rank fills its
    shards with `fill_shards`); refused under `trainer.prefix_sharing` when its layers are not all softmax attention."""
    hf_config = AutoConfig.from_pretrained(resolve_model_path(path))
    if trainer_config.prefix_sharing and (refusal := prefix_sharing_refusal(hf_config.to_dict(), path)):
        raise ValueError(refusal)
    if empty:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(
                hf_config, dtype=TORCH_DTYPES[trainer_config.param_dtype], attn_implementation=trainer_config.attention
            )
    model = AutoModelForCausalLM.from_pretrained(
        resolve_model_path(path),
        config=hf_config,
        dtype=TORCH_DTYPES[trainer_config.param_dtype],
        attn_implementation=trainer_config.attention,
    )
    return model.to(trainer_config.device)


def fill_shards(sharded: torch.nn.Module, lm: torch.nn.Module, path: str, device: str) -> None:
    """Allocate this rank's shards of `sharded` (FSDP2 over `lm`, built by `load_causal_lm(..., empty=True)`) on
    `device` and read them from the model's safetensors files (`rl.training.sharded_load`): no rank holds the whole
    model."""
    model_dir = Path(resolve_model_path(path))
    if not model_dir.is_dir():  # a hub id: its files in the Hugging Face cache (downloaded once if missing)
        from huggingface_hub import snapshot_download

        model_dir = Path(snapshot_download(path, allow_patterns=["*.safetensors", "*.json"]))
    sharded.to_empty(device=device)
    load_shards(lm, model_dir)


def load_policy(
    path: str, trainer_config: TrainerConfig, ranks: distributed.Ranks, kl_reference: bool
) -> tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module | None]:
    """(lm, model, reference): the transformers model (with `trainer.lora`, the peft model around it), the model
    trained (FSDP2 over the ranks, or `lm` itself with one rank) and the frozen KL reference (or None).

    Sharded ranks build both models on the meta device and read their own shards (`fill_shards`); a LoRA policy is
    loaded whole before sharding (its adapters wrap the loaded layers)."""
    adapters = trainer_config.lora.enabled
    empty = ranks.world > 1 and not adapters
    lm = load_causal_lm(path, trainer_config, empty=empty)
    if trainer_config.gradient_checkpointing:
        reentrant = ranks.world == 1 and not adapters  # a reentrant checkpoint of frozen inputs gives no gradient
        lm.gradient_checkpointing_enable(
            **({} if reentrant else {"gradient_checkpointing_kwargs": {"use_reentrant": False}})
        )
    if adapters:
        lm = lora.with_adapters(lm, trainer_config.lora)
    lm.train()
    model = shard(lm, trainer_config, ranks)
    if empty:
        fill_shards(model, lm, path, trainer_config.device)
    reference = None
    if kl_reference:
        frozen = load_causal_lm(path, trainer_config, empty=ranks.world > 1).eval().requires_grad_(False)
        reference = shard(frozen, trainer_config, ranks)
        if ranks.world > 1:
            fill_shards(reference, frozen, path, trainer_config.device)
    return lm, model, reference


def mixed_precision(trainer_config: TrainerConfig, ranks: distributed.Ranks) -> bool:
    """Sharded on GPU with a lower compute dtype: FSDP2 gathers the weights in it (no autocast)."""
    return ranks.world > 1 and trainer_config.device == "cuda" and trainer_config.dtype != trainer_config.param_dtype


def shard(model: torch.nn.Module, trainer_config: TrainerConfig, ranks: distributed.Ranks) -> torch.nn.Module:
    """FSDP2 over the ranks (mixed precision on GPU), or the model itself with one rank."""
    if ranks.world == 1:
        return model
    param_dtype = TORCH_DTYPES[trainer_config.dtype] if mixed_precision(trainer_config, ranks) else None
    return distributed.shard(model, device=trainer_config.device, param_dtype=param_dtype)


class PolicyTrainer(MetricsActor, ServiceReplica):
    """Owns the trainable policy (and the frozen reference when a KL term is configured); `ping` answers each rank's
    process id (what a trainer recovery watches and kills: `rl.loop.recovery`)."""

    memory_role = "trainer"

    def __init__(
        self,
        trainer_config: TrainerConfig,
        loss: LossConfig,
        model_path: str,
        total_steps: int,
        *,
        weight_transport: str,
        wire_dtype: DType,
        weight_delta: DeltaMode = "never",
        delta_full_every: int = 50,
    ):
        """`total_steps`: optimizer steps the LR schedule is sized for; `weight_transport`: `weight_sync.transport`;
        `wire_dtype`: the dtype pushed weights travel in (the generators' weights dtype); `weight_delta`,
        `delta_full_every`: `weight_sync.delta` and `weight_sync.delta_full_every`."""
        world = trainer_config.ranks
        pin_process(
            trainer_config.cpus, rank=current_rank().rank % trainer_config.num_procs, of=trainer_config.num_procs
        )
        torch.manual_seed(trainer_config.seed)
        name_process(f"trainer/{current_rank().rank}")
        if world > 1:  # each step gathers and frees every layer's weights and gradients (see rl.processes.heap)
            return_large_blocks_to_the_system()
        self.trainer_config = trainer_config
        self.loss = loss
        self.wire_dtype = TORCH_DTYPES[wire_dtype]
        self.device = torch.device(trainer_config.device)
        if trainer_config.device == "cuda" and trainer_config.gpu_memory_fraction is not None:
            # generators may share the GPU
            torch.cuda.set_per_process_memory_fraction(trainer_config.gpu_memory_fraction)
        self.ranks = distributed.init_process_group(trainer_config.device) if world > 1 else distributed.Ranks.single()
        reset_peaks()
        before_load = rss_bytes()
        self.lm, self.model, self.reference = load_policy(model_path, trainer_config, self.ranks, loss.kl_coef > 0)
        """`lm`: the transformers model (sharded in place when there are several ranks), or with `trainer.lora` the
        peft model around it: the trainable part of its state dict is the policy's."""
        self.optimizer = torch.optim.AdamW(
            [parameter for parameter in self.model.parameters() if parameter.requires_grad],  # LoRA: the adapters
            lr=trainer_config.lr,
            betas=trainer_config.betas,
            weight_decay=trainer_config.weight_decay,
        )
        self.copy = (
            ComputeCopy(self.model, self.optimizer)
            if computes_on_a_copy(trainer_config, self.ranks.world, wire_dtype)
            else None
        )
        """The bf16 weights the policy's passes compute with, when `computes_on_a_copy`."""
        steps = total_steps * trainer_config.ppo_n_minibatches  # one LR step per optimizer step
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(trainer_config, steps))
        self.policy_version = 0
        self.publisher = weight_sync.WeightPublisher(weight_transport)
        # the peak while the model (and reference) loaded, and its growth over the rank's memory before (what
        # `rlmesh validate` estimates), in the first step's record; the steps' peaks start here
        record_metric("memory/trainer/load_peak_rss_mb", peak_rss_bytes() / MIB, Reduce.MAX)
        record_metric("memory/trainer/load_growth_mb", (peak_rss_bytes() - before_load) / MIB, Reduce.MAX)
        reset_peaks()
        param_dtype = TORCH_DTYPES[trainer_config.param_dtype]
        self.deltas = (
            DeltaPublisher(self.publisher, weight_delta, delta_full_every)
            if sends_deltas(weight_delta, self.wire_dtype, param_dtype, trainer_config.lora.enabled)
            else None
        )
        """Set when versions may travel as deltas (`rl.weights.delta_sync`)."""

    def compute(self):
        """Forward passes run in `trainer.dtype` (autocast, or FSDP2's mixed precision) over the `trainer.param_dtype` weights."""
        trainer_config = self.trainer_config
        if mixed_precision(trainer_config, self.ranks):
            return contextlib.nullcontext()
        return compute_context(trainer_config.device, trainer_config.param_dtype, trainer_config.dtype)

    def weights(self):
        """The policy's weights for its passes: the bf16 copy in their place when there is one (`computes_on_a_copy`)."""
        return contextlib.nullcontext() if self.copy is None else self.copy.active()

    @endpoint
    async def train_step(self, micro_batches: list[TensorDict]) -> dict[str, float]:
        """K optimizer steps over the batch's micro-batches (see `rl.training.train_step`); returns loss and diagnostics."""
        trainer_config = self.trainer_config
        if self.ranks.world > 1:
            micro_batches = distributed.rank_rows(micro_batches, self.ranks, trainer_config.micro_batch_size)
        metrics = train_step(
            self.model,
            self.optimizer,
            self.scheduler,
            micro_batches,
            self.loss,
            max_grad_norm=trainer_config.max_grad_norm,
            horizon=trainer_config.seq_len,
            n_minibatches=trainer_config.ppo_n_minibatches,
            reference=self.reference,
            device=self.device,
            compute=self.compute,
            weights=self.weights,
            ranks=self.ranks,
        )
        return_free_heap_pages()  # the step's freed small blocks (see rl.processes.heap)
        return metrics

    @endpoint
    async def push_weights(
        self, policy_version: int, fingerprint: bool = False, full: bool = False
    ) -> Fingerprints | None:
        """Publish the current weights as `policy_version`; with `fingerprint`, return the version's fingerprints
        (`rl.weights.attestation`: what each generator must then prove it serves). `full`: publish the last published
        version `policy_version` once more, whole (generators that lack a delta's base load it)."""
        if self.deltas is not None:
            return await self._push_with_deltas(policy_version, fingerprint, full)
        # sent in the generators' dtype: half the bytes when they run bf16
        if self.trainer_config.lora.enabled:
            state_dict = lora.adapter_state_dict(self.lm)  # the adapters alone; the generators hold the base
        else:  # sharded: the DTensor parameters themselves (ties by identity)
            state_dict = self.lm.state_dict(keep_vars=self.ranks.world > 1)
        fingerprints = await self.publisher.publish(
            state_dict, policy_version, self.wire_dtype, self.ranks, fingerprint=fingerprint
        )
        if self.ranks.rank == 0:
            record_metric("weight_sync/bytes", weight_sync.payload_bytes(state_dict, self.wire_dtype), Reduce.MAX)
        self.policy_version = policy_version
        return_free_heap_pages()
        return fingerprints

    async def _push_with_deltas(self, policy_version: int, fingerprint: bool, full: bool) -> Fingerprints | None:
        if full:
            fingerprints, stats = await self.deltas.publish_again(
                policy_version, self.wire_dtype, self.ranks, fingerprint=fingerprint
            )
        else:
            state_dict = self.lm.state_dict(keep_vars=self.ranks.world > 1)
            fingerprints, stats = await self.deltas.publish(
                state_dict, policy_version, self.wire_dtype, self.ranks, fingerprint=fingerprint
            )
        if self.ranks.rank == 0:
            record_metric("weight_sync/bytes", stats.bytes, Reduce.SUM)  # a repair's full version adds to the delta
            record_metric("weight_sync/delta", float(stats.delta), Reduce.MIN)
            if not full:
                record_metric("weight_sync/changed_fraction", stats.changed_fraction, Reduce.MAX)
        self.policy_version = policy_version
        return_free_heap_pages()
        return fingerprints

    @endpoint
    async def release_weights(self) -> None:
        """Free the published weights' shared memory (before the process is stopped)."""
        self.publisher.close()

    @endpoint
    async def save_checkpoint(self, path: str, weights_only: bool = False) -> None:
        """Model, optimizer, LR schedule and this process's RNG into the checkpoint directory `path` (`weights_only`:
        the model and the RNG)."""
        checkpoint.save_trainer_rank(Path(path), self.lm, self.optimizer, self.scheduler, self.ranks.rank, weights_only)
        # the peak since the step's record was taken (the save follows it), in the next step's record
        record_metric("memory/trainer/checkpoint_peak_rss_mb", peak_rss_bytes() / MIB, Reduce.MAX)

    @endpoint
    async def load_checkpoint(self, path: str) -> None:
        """The trainer state of checkpoint `path` into this rank (a resume, a trainer recovery); its peak, and its growth
        over the rank's memory before, in the next step's record (the step's own peak starts after it)."""
        reset_peaks()
        before = rss_bytes()
        checkpoint.load_trainer_rank(Path(path), self.lm, self.optimizer, self.scheduler)
        if self.copy is not None:
            self.copy.refresh()
        record_metric("memory/trainer/resume_peak_rss_mb", peak_rss_bytes() / MIB, Reduce.MAX)
        record_metric("memory/trainer/resume_growth_mb", (peak_rss_bytes() - before) / MIB, Reduce.MAX)
        reset_peaks()

    @endpoint
    async def logprobs(self, token_ids: list[int], reference: bool = False) -> list[float] | None:
        """Logprob of each token given its prefix under the current weights (position 0 gets 0.0),
        or under the frozen reference model (None when the run has none)."""
        model = self.reference if reference else self.model
        if model is None:
            return None
        input_ids = torch.tensor([token_ids], device=self.device)
        position_ids = torch.arange(len(token_ids), device=self.device).unsqueeze(0)
        model.eval()  # no dropout (LoRA's): the policy's own logprobs
        try:
            weights = self.weights() if model is self.model else contextlib.nullcontext()
            with torch.no_grad(), weights, self.compute():
                return token_logprobs(model, input_ids, position_ids)[0].tolist()
        finally:
            model.train(model is self.model)
