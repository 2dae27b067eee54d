"""Numeric precision of the trainer and the sampler, and a watch on how far they drift apart.

The trainer keeps fp32 master weights and optimizer state; `trainer.dtype` below fp32 only
changes the compute (autocast). Pure low-precision parameters stop learning quietly: AdamW's
updates at RL learning rates fall below bf16's rounding step. A sampler in lower precision than
the trainer's weights samples from a slightly different policy; `MismatchWatch` warns when
that gap grows during a run.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

import torch

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def native_bf16(device: str) -> bool:
    """Whether `device` runs bf16 matmuls natively: a CUDA GPU with bf16 support, or a CPU where oneDNN has bf16
    kernels (AVX512-BF16 or AMX: `torch.ops.mkldnn._is_mkldnn_bf16_supported()`). Elsewhere bf16 falls back to
    PyTorch's reference GEMM, measured >20x slower than fp32 on an AVX2-only CPU."""
    if device == "cuda":  # a launcher without a GPU cannot ask: the trainer's GPUs are taken to be bf16-capable
        from rl.gpus import local_gpus  # asked in a child process: no CUDA context in this one

        return not torch.cuda.is_available() or local_gpus().count == 0 or local_gpus().bf16
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def resolve_precision(trainer_dtype: str, sampler_dtype: str, param_dtype: str, native: bool) -> tuple[str, str]:
    """(`trainer.dtype`, `generator.dtype`) with "auto" resolved on either side so that the trainer's compute and the
    sampler's weights have one dtype (the pair the project measured to learn: README, "Precision"):
    both "auto": the parameters' dtype for both (fp32: the sampler runs the trainer's exact policy, everywhere);
    a sampler set to bf16: trainer bf16 where bf16 is `native` (else the parameters' dtype, a mismatch
    `known_not_to_learn` names); a trainer set explicitly: the sampler follows its compute dtype. An explicit value
    is kept as it is. Both "auto" stays fp32 where bf16 is native: bf16 on both sides learned half as fast per step on
    the main job; a bf16 trainer on its stochastically rounded compute copy against the fp32 sampler learned as well
    as fp32 but its steps were no faster (benchmarks/README.md, "Precision")."""
    if trainer_dtype == "auto":
        wanted = param_dtype if sampler_dtype == "auto" else sampler_dtype
        lower = wanted == "bfloat16" and native and param_dtype == "float32"
        trainer_dtype = "bfloat16" if lower else param_dtype
    if sampler_dtype == "auto":
        sampler_dtype = trainer_dtype
    return trainer_dtype, sampler_dtype


def known_not_to_learn(trainer_dtype: str, sampler_dtype: str, corrected: bool, copy: bool = False) -> list[str]:
    """Why a resolved trainer / sampler precision pair is known not to learn (measured on the main job, README
    "Precision"); empty when it is not. `corrected`: an importance-weighting rollout correction is on; `copy`: the
    trainer computes on the stochastically rounded compute copy (`computes_on_a_copy`), not under autocast."""
    if trainer_dtype == sampler_dtype or (trainer_dtype == "float32" and sampler_dtype == "float32"):
        return []
    if _BITS[trainer_dtype] < _BITS[sampler_dtype]:
        if copy:
            return []
        return [
            f"trainer.dtype = {trainer_dtype} computes below the sampler's generator.dtype = {sampler_dtype} under "
            "autocast (a sharded or LoRA trainer): the main job with bf16 autocast against an fp32 sampler did not "
            "learn (held-out 0.60 -> 0.35, train/mismatch_k3 0.0007 -> 0.35), because autocast's nearest-rounded "
            "weights hide the updates below bf16's rounding step. Set both to the same dtype"
        ]
    if corrected:
        return []
    return [
        f"generator.dtype = {sampler_dtype} samples below the trainer's {trainer_dtype} without a rollout correction: "
        "the main job learned far less (training reward 0.16 -> 0.23 against 0.91 with an fp32 sampler). Set both "
        "to the same dtype or [loss.rollout_correction] preset = 'decoupled_token_is'"
    ]


def precision_warnings(config: Any) -> list[str]:
    """`known_not_to_learn` of a validated config's resolved pair (`rlmesh validate` and `rlmesh train` print them)."""
    corrected = config.loss.rollout_correction.rollout_is is not None
    copy = computes_on_a_copy(config.trainer, config.trainer.ranks, config.generator.dtype)
    return known_not_to_learn(config.trainer.dtype, config.generator.dtype, corrected, copy)


_BITS = {"float32": 24, "bfloat16": 8, "float16": 11}  # mantissa bits: how finely each dtype resolves an update


def computes_on_a_copy(trainer: Any, world: int, sampler_dtype: str) -> bool:
    """Whether a trainer (`TrainerConfig`, in `world` processes, its generators' weights in `sampler_dtype`) computes
    in bf16 on a stochastically rounded bf16 copy of its fp32 weights (`rl.training.compute_copy`: it sees every
    update in expectation) rather than under autocast, whose nearest-rounded casts hide the updates below bf16's
    rounding step: one process, bf16 over fp32, no LoRA, against an fp32 sampler (the pair measured). A sharded
    trainer gathers its weights in bf16 through FSDP2 instead; a LoRA trainer, and a trainer whose sampler gets bf16
    weights (rounded to nearest, so both sides see the same updates), keep autocast."""
    one_process = world == 1 and not trainer.lora.enabled
    return one_process and trainer.dtype == "bfloat16" and trainer.param_dtype == sampler_dtype == "float32"


def compute_context(device: str, param_dtype: str, compute_dtype: str) -> contextlib.AbstractContextManager:
    """Autocast to `compute_dtype` when it is below the parameters' dtype, else a no-op."""
    if compute_dtype == param_dtype:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device, dtype=TORCH_DTYPES[compute_dtype])


@dataclass
class MismatchWatch:
    """Warns when `train/mismatch_k3` (KL between sampler and trainer) grows past `factor` x its first value.

    `floor` keeps an exactly on-policy run (mismatch ~1e-9) from warning on noise.
    """

    factor: float
    floor: float
    first: float | None = None
    warned: bool = False

    def check(self, mismatch_k3: float, staleness: int = 0) -> str | None:
        """A warning the first time the mismatch exceeds max(factor x first value, floor); else None. `staleness`: how
        many versions older than the trainer's the step's oldest sampled token is (0: every row is on-policy)."""
        if self.first is None:
            self.first = mismatch_k3
            return None
        limit = max(self.factor * self.first, self.floor)
        if self.warned or mismatch_k3 <= limit:
            return None
        self.warned = True
        above = f"train/mismatch_k3 = {mismatch_k3:.3g} is above {limit:.3g} ({self.factor:g} x its first value {self.first:.3g})"
        if staleness > 0:  # rows of older versions: the policy's own change since counts in the mismatch
            return (
                f"{above}, on rows sampled up to {staleness} version(s) before the trainer's: part of it is the "
                "policy's change since then (run.max_policy_staleness), which the rollout correction weighs; the rest "
                "may be a sampler drifting from the trainer's policy (a lower-precision generator.dtype); see "
                "docs/precision.md."
            )
        return (
            f"{above}: the sampler's policy is drifting from the trainer's. A lower-precision sampler than the "
            "trainer's weights (generator.dtype) is the usual cause; see docs/precision.md."
        )


@dataclass
class NonfiniteSteps:
    """Counts steps in a row whose every update was skipped for a non-finite gradient norm (the weights, optimizer
    state and policy version stay as they were); `limit` such steps in a row stop the run (`trainer.max_nonfinite_steps`)."""

    limit: int
    in_row: int = 0

    def check(self, step: int, metrics: dict[str, float], minibatches: int) -> tuple[str, bool] | None:
        """None when step `step` updated the weights; else its warning and whether the run must stop."""
        if metrics.get("train/skipped_nonfinite_steps", 0) < minibatches:
            self.in_row = 0
            return None
        self.in_row += 1
        warning = (
            f"step {step}: gradient norm {metrics.get('train/grad_norm')} is not finite; the update was skipped "
            f"({self.in_row} in a row, trainer.max_nonfinite_steps = {self.limit})"
        )
        return warning, self.in_row >= self.limit
