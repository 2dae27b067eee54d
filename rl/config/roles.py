"""The sections of the roles: the policy model, its generators (vLLM) and its trainer, how weights move between them,
and the frozen models (`[models.<name>]`: teachers, samplers) served beside them."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from rl.config.lora import LoraConfig
from rl.config.section import Device, DType, Section


class ModelConfig(Section):
    path: str = "smollm2-135m-instruct"
    """HF folder, hub id, or a built-in offline asset: "smollm2-135m-instruct", "tiny-qwen3" (checked by
    `rl.loop.resolve`, which knows the assets)."""


class FrozenModelConfig(Section):
    """A model that is served but never trained: a teacher, or a sampler of demonstrations."""

    path: str
    """HF folder, hub id, or a built-in offline asset ("tiny-qwen3", ...)."""
    dtype: DType = "float32"
    """Weights dtype of its generators."""
    device: Device = "cpu"
    """Where its generators run."""
    replicas: int = Field(1, ge=1)
    """Generator replicas serving it (`[services.models]` sets their deadlines and restarts)."""


class SamplingConfig(Section):
    temperature: float = Field(1.0, ge=0)
    """Softmax temperature. 1.0 samples the policy itself (what the policy-gradient loss assumes); 0 is greedy."""
    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling: keep the smallest set of most likely tokens whose probability reaches this; 1.0 = off.
    Below 1 the sampler no longer samples the policy the trainer scores."""
    top_k: int = Field(-1, ge=-1)
    """Keep the k most likely tokens only; -1 (or 0) = off (vLLM's word; it refuses anything below -1). Like `top_p`, a cut makes the sampler differ from
    the policy."""
    stop_token_ids: list[Annotated[int, Field(ge=0)]] = []
    """More token ids that end a completion (finish reason "stop", as at an end-of-turn token), besides the
    renderers' end-of-turn tokens, which always do: a task whose format ends on its own token stops there."""


class GeneratorConfig(Section):
    num_replicas: int = Field(1, ge=1)
    """vLLM engines serving the policy, each in a process of its own; a request goes to the healthy replica with the
    fewest outstanding."""
    device: Device = "cpu"
    """Where the engines run; must equal `trainer.device`."""
    dtype: DType | Literal["auto"] = "auto"
    """Weights dtype of the sampler; "auto" = the trainer's compute dtype (`trainer.dtype`, resolved with it: both
    "auto" gives the parameters' dtype, fp32, so it samples the trainer's exact policy). A lower dtype halves
    weight-sync bytes but samples a drifting policy (see `run.mismatch_warn_factor`)."""
    tensor_parallel_size: int = Field(1, ge=1)
    """GPUs per replica: vLLM shards the model over them (tensor parallelism)."""
    enforce_eager: bool = True
    """Skip graph compilation: fast start-up (~3 s) at some decode speed. On CPU a compiled engine (vLLM traces the
    model once with TorchDynamo and compiles it with inductor) decoded the main job 15-22% faster with the same tokens,
    but starts in ~70 s the first time and ~20 s once inductor's cache holds the model, which on a run of the main
    job's length costs more than its steps save; and a request decoding alone there gets other bits (logprobs 2e-5
    apart where measured) than in a batch, which an eager CPU engine prevents (`rl.processes.single_rows`)
    (benchmarks/README.md, "Generation profile")."""
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    """CUDA only; on CPU the KV cache is sized by `cpu_kv_cache_gib`."""
    cpu_kv_cache_gib: int = Field(2, ge=1)
    """CPU only: GiB of KV cache per engine (vLLM's `VLLM_CPU_KVCACHE_SPACE`, unless that is set in the
    environment). 2 GiB holds ~45k tokens of SmolLM2-135M's fp32 KV cache."""
    max_num_seqs: int = Field(256, ge=1)
    """Most sequences one engine decodes at once (vLLM's `max_num_seqs`); further requests wait in its queue."""
    block_size: int | None = Field(None, ge=16)
    """Tokens per KV-cache block (vLLM's `block_size`); None = 32 on CPU (the smallest block vLLM's CPU attention
    takes; vLLM's own CPU default is 128), vLLM's choice on GPU. vLLM's prefix cache shares whole blocks only, so a
    group's samples share the KV of their common prompt (one prefill instead of one per sample) only for the blocks
    the prompt fills."""
    max_model_len: int = Field(2048, ge=16)
    """Longest sequence (prompt + completion) an engine accepts; every task's `env.max_total_tokens` must fit."""
    seed: int = 0
    """vLLM's engine seed. Sampling does not depend on it: each request carries its own seed, from `run.seed`, the
    rollout id and the turn."""
    fp64_sampling_noise: bool = False
    """Sample by an exponential race with fp64 noise (vLLM's `use_fp64_gumbel`) instead of the device's fast path
    (on CPU a fused fp32 Gumbel-max kernel): keeps tail events fp32 noise truncates, at some sampling speed.
    Both are exact on the main job to what we could measure (benchmarks/README.md, "Learning per step")."""
    sampling: SamplingConfig = SamplingConfig()
    """Sampling of the training rollouts."""
    eval_sampling: SamplingConfig = SamplingConfig(temperature=0.0)
    """Sampling for held-out validation (greedy by default)."""
    on_weight_update: Literal["finish", "resubmit", "continue"] = "finish"
    """Requests in flight at a weight reload: finish on the old weights; abort and restart from the prompt on the new;
    or pause and continue on the new from the tokens they sampled (each token labelled with its version)."""
    cpus: list[int] | None = None
    """CPU cores for the generator processes (split evenly between replicas); None = no pinning."""
    colocate_with_trainer: bool = False
    """CUDA, on the launcher's host: the generator replicas share the trainer's GPUs (replica i on the GPUs from
    i x tensor_parallel_size) instead of taking the GPUs after them, so one GPU runs both roles. Size
    `gpu_memory_utilization` and `trainer.gpu_memory_fraction` to fit together."""


class TrainerConfig(Section):
    device: Device = "cpu"
    """Where the trainer runs: "cpu", or "cuda" with one GPU per rank."""
    dtype: DType | Literal["auto"] = "auto"
    """Compute dtype: below `param_dtype` the forward/backward runs in it over fp32 master weights, on a bf16 copy of
    them stochastically rounded once per optimizer step (one process, no LoRA, an fp32 sampler:
    `rl.training.compute_copy`), else under autocast. "auto" resolves with `generator.dtype` so the two never silently disagree: both "auto" =
    `param_dtype` for both (the pair measured to learn); a bf16 sampler = bf16 where the device runs bf16 matmuls natively
    (CUDA; a CPU with AVX512-BF16/AMX), else `param_dtype` (`rlmesh validate` warns). Explicit "bfloat16" on a CPU
    without native bf16 is refused."""
    param_dtype: DType = "float32"
    """Dtype of the parameters and optimizer state. Below fp32 only with `pure_low_precision = true`."""
    pure_low_precision: bool = False
    """Allow low-precision parameters: AdamW updates at RL learning rates mostly round away in bf16."""
    lr: float = Field(1e-6, gt=0)
    """AdamW's learning rate (the peak, after warm-up). The default 1e-6 is TRL's GRPO default, a rate for models of a
    billion parameters and more (the shipped Qwen3 GPU configs use it). A small model needs a larger one: the main
    job (SmolLM2-135M, fp32) and the `rlmesh new-task` config use 2e-5, where its reward rises within a few steps;
    `rlmesh validate` and `train` warn when it is left at the default for a model below a billion parameters."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW's decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW's (β1, β2)."""
    max_grad_norm: float = Field(1.0, gt=0)
    """Gradients are clipped to this global L2 norm; `train/grad_norm` logs the norm before clipping."""
    max_nonfinite_steps: int = Field(3, ge=1)
    """Steps in a row whose gradient norm is not finite (each skipped, weights unchanged) before the run stops."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """The LR after warm-up, over the run's optimizer steps (from `run.steps`, `run.epochs` or `run.max_rows`,
    whichever ends first): constant, linear to 0, or cosine to 0."""
    warmup_steps: int = Field(0, ge=0)
    """Optimizer steps of linear warm-up, from lr/(warmup_steps+1) to lr."""
    seq_len: int = Field(1024, ge=8)
    """Row length L of packed `[B, L]` training batches; a longer rollout is dropped."""
    prefix_sharing: bool = True
    """Pack samples as prefix trees (`rl.packing.prefix_tree`): a prefix shared by several samples (a group's prompt) is
    forwarded once per row, under a mask that gives every token exactly its own prefix (same logprobs and
    gradients as independent sequences, to fp32 rounding). False: samples side by side, each whole. Refused for models
    with layers that ignore the mask (linear attention, gated delta nets, Mamba: `rl.packing.attention_kinds`)."""
    attention: Literal["sdpa", "flex_attention"] = "sdpa"
    """The trainer's attention kernel: "sdpa" takes the prefix-tree mask as a dense [L, L] bool mask per row;
    "flex_attention" as a block-sparse BlockMask (compiled; the path for GPUs and long rows)."""
    micro_batch_size: int = Field(8, ge=1)
    """Rows per forward/backward; gradients accumulate over the micro-batches of a step."""
    ppo_n_minibatches: int = Field(1, ge=1)
    """K optimizer steps per batch on disjoint minibatches, against π_old computed once without gradients."""
    seed: int = 0
    """torch's seed in the trainer processes."""
    gradient_checkpointing: bool = False
    """Activation checkpointing: recompute each decoder layer's activations in backward."""
    cpus: list[int] | None = None
    """CPU cores the trainer processes run on (split evenly between a host's processes); None = no pinning."""
    num_procs: int = Field(1, ge=1)
    """Trainer processes (ranks) per host; above one in all, the model is sharded over them with FSDP2."""
    num_hosts: int = Field(1, ge=1)
    """Hosts of the trainer; more than one needs a `[cluster]` scheduler that allocates hosts."""
    gpu_memory_fraction: float | None = Field(None, gt=0, le=1)
    """CUDA only: the most of its GPU's memory each trainer process's allocator takes
    (`torch.cuda.set_per_process_memory_fraction`); None = no limit. Needed when generators share its GPU."""
    lora: LoraConfig = LoraConfig()
    """`[trainer.lora]`: low-rank adapters on the frozen base instead of full fine-tuning (off by default)."""
    call_timeout_s: float = Field(1800.0, gt=0)
    """Deadline of every trainer call but the weight push (`run.weight_sync_timeout_s`): a train step, logprobs,
    a checkpoint's save or load. A missed one stops the run (resume from the last checkpoint), as the trainer's death does."""

    @property
    def ranks(self) -> int:
        """Trainer processes in all: `num_procs` x `num_hosts`."""
        return self.num_procs * self.num_hosts


class WeightSyncConfig(Section):
    transport: Literal["shared_memory", "torchstore"] = "shared_memory"
    """"shared_memory": bytes through a shared file on this host, torchstore carries a versioned handle;
    "torchstore": every tensor through the store (needed when trainer and generators are on different hosts)."""
    attest: bool = True
    """After every sync each generator replica proves, before it takes traffic, that the weights vLLM holds and the
    version it stamps are the trainer's (`rl.weights.attestation`); a replica that cannot is replaced. With
    `trainer.lora` a sync's attestation is the adapter's: the trainer fingerprints the adapter tensors it publishes and
    each replica measures the adapter in the LoRA slot vLLM serves that version from (then the probe-logprob check,
    `trainer.lora.sync_check_tolerance`, proves it end to end through vLLM's LoRA kernels)."""
    delta: Literal["auto", "always", "never"] = "auto"
    """Send only the elements whose bits changed in the generators' dtype (`rl.weights.delta`): the trainer keeps the
    last published version and per tensor block sends the changed elements' offsets (or a bitmap) and values, or the
    block whole when that is smaller; each generator applies a delta only onto the exact version it was made against,
    proves the result bit for bit, and otherwise gets a full version. "auto": deltas only when the generators' dtype
    is narrower than `trainer.param_dtype` (fp32 published in fp32 changes nearly every element each step), with a full
    version every `delta_full_every` syncs and instead of a delta above half its size; "always": a delta whenever
    there is a base; "never": every version whole. Adapter-only syncs (`trainer.lora`) always send the adapters whole."""
    delta_full_every: int = Field(default=50, ge=1)
    """With `delta = "auto"`: every this many syncs the version goes whole, so a delta chain never grows unbounded."""
