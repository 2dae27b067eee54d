"""The typed configuration of a run, read from TOML and dotted CLI overrides.

Every section forbids unknown keys and checks types, so a typo or a wrong type fails
before any actor starts, with the offending key named (`trainer.lrr: Extra inputs are not
permitted`). Device, dtype and parallelism are plain fields: the GPU paths are selected
here, not by code edits.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, field_validator, model_serializer, model_validator

from rollouts.renderer_env import RendererEnvConfig
from rl.algorithms.config import AlgorithmConfig, FrozenModelConfig, TaskAlgorithmConfig
from env_types.renderer import RendererConfig
from rl.section import Device, DType, Section
from rl.services.config import ServicesConfig

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}")
_PRECISION_BITS = {"float32": 24, "bfloat16": 8, "float16": 11}


class ModelConfig(Section):
    path: str = "smollm2-135m-instruct"
    """HF folder, hub id, or a built-in offline asset: "smollm2-135m-instruct", "tiny-qwen3"."""

    @field_validator("path")
    @classmethod
    def _known_model(cls, path: str) -> str:
        from rl.assets import BUILTIN_MODELS

        if path in BUILTIN_MODELS or Path(path).expanduser().is_dir() or _HUB_ID.fullmatch(path):
            return path
        raise ValueError(
            f"{path!r} is neither a built-in model ({', '.join(sorted(BUILTIN_MODELS))}), an existing directory, "
            "nor a hub id like 'org/name'"
        )


class SamplingConfig(Section):
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = -1


class GeneratorConfig(Section):
    num_replicas: int = Field(1, ge=1)
    device: Device = "cpu"
    dtype: DType | Literal["auto"] = "auto"
    """Weights dtype of the sampler; "auto" = the trainer's parameter dtype, so it samples the exact policy.
    A lower dtype halves weight-sync bytes but samples a drifting policy (see `run.mismatch_warn_factor`)."""
    tensor_parallel_size: int = Field(1, ge=1)
    enforce_eager: bool = True
    """Skip graph compilation: fast start-up (~3 s) at some decode speed."""
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1)
    """CUDA only; on CPU the KV cache is sized by `cpu_kv_cache_gib`."""
    cpu_kv_cache_gib: int = Field(2, ge=1)
    max_num_seqs: int = Field(256, ge=1)
    max_model_len: int = Field(2048, ge=16)
    seed: int = 0
    fp64_sampling_noise: bool = False
    """Sample by an exponential race with fp64 noise (vLLM's `use_fp64_gumbel`) instead of the device's fast path
    (on CPU a fused fp32 Gumbel-max kernel): keeps tail events fp32 noise truncates, at some sampling speed.
    Both are exact on the main job to what we could measure (README, "Learning per step")."""
    sampling: SamplingConfig = SamplingConfig()
    eval_sampling: SamplingConfig = SamplingConfig(temperature=0.0)
    """Sampling for held-out validation (greedy by default)."""
    on_weight_update: Literal["finish", "resubmit"] = "finish"
    """Requests in flight at a weight reload: finish on the old weights, or abort and restart on the new."""
    cpus: list[int] | None = None
    """CPU cores for the generator processes (split evenly between replicas); None = no pinning."""


class TrainerConfig(Section):
    device: Device = "cpu"
    dtype: DType | Literal["auto"] = "auto"
    """Compute dtype: below `param_dtype` the forward/backward runs under autocast over fp32 master weights.
    "auto": bf16 where the device runs bf16 matmuls natively (CUDA; a CPU with AVX512-BF16/AMX), else
    `param_dtype`; resolved when the config is validated. Explicit "bfloat16" on a CPU without it is refused."""
    param_dtype: DType = "float32"
    """Dtype of the parameters and optimizer state. Below fp32 only with `pure_low_precision = true`."""
    pure_low_precision: bool = False
    """Allow low-precision parameters: AdamW updates at RL learning rates mostly round away in bf16."""
    lr: float = Field(1e-6, gt=0)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    max_grad_norm: float = Field(1.0, gt=0)
    max_nonfinite_steps: int = Field(3, ge=1)
    """Steps in a row whose gradient norm is not finite (each skipped, weights unchanged) before the run stops."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    seq_len: int = Field(1024, ge=8)
    """Row length L of packed `[B, L]` training batches; a longer rollout is dropped."""
    prefix_sharing: bool = True
    """Pack samples as prefix trees (`rl.prefix_packing`): a prefix shared by several samples (a group's prompt) is
    forwarded once per row, under a mask that gives every token exactly its own prefix (same logprobs and
    gradients as independent sequences, to fp32 rounding). False: samples side by side, each whole."""
    attention: Literal["sdpa", "flex_attention"] = "sdpa"
    """The trainer's attention kernel: "sdpa" takes the prefix-tree mask as a dense [L, L] bool mask per row;
    "flex_attention" as a block-sparse BlockMask (compiled; the path for GPUs and long rows)."""
    micro_batch_size: int = Field(8, ge=1)
    """Rows per forward/backward; gradients accumulate over the micro-batches of a step."""
    ppo_n_minibatches: int = Field(1, ge=1)
    """K optimizer steps per batch on disjoint minibatches, against π_old computed once without gradients."""
    seed: int = 0
    gradient_checkpointing: bool = False
    """Activation checkpointing: recompute each decoder layer's activations in backward."""
    cpus: list[int] | None = None
    """CPU cores the trainer processes run on (split evenly between a host's processes); None = no pinning."""
    num_procs: int = Field(1, ge=1)
    """Trainer processes (ranks) per host; above one in all, the model is sharded over them with FSDP2."""
    num_hosts: int = Field(1, ge=1)
    """Hosts of the trainer; more than one needs a `[cluster]` scheduler that allocates hosts."""
    call_timeout_s: float = Field(1800.0, gt=0)
    """Deadline of every trainer call but the weight push (`run.weight_sync_timeout_s`): a train step, logprobs,
    a checkpoint's save or load. A missed one stops the run (resume from the last checkpoint), as the trainer's death does."""

    @property
    def ranks(self) -> int:
        """Trainer processes in all: `num_procs` x `num_hosts`."""
        return self.num_procs * self.num_hosts


class RubricConfig(Section):
    """Replaces a task's default rubric."""

    class RewardFnEntry(Section):
        fn: str
        """Registered name or import path `package.module:function`."""
        weight: float = Field(1.0, ge=0)
        name: str = ""
        args: dict[str, Any] = Field(default_factory=dict)
        """Keyword arguments bound to the function (`functools.partial`), e.g. `{ tolerance = 0.01 }`."""

    reward_fns: list[RewardFnEntry] = Field(default_factory=list)
    group_reward_fns: list[RewardFnEntry] = Field(default_factory=list)
    """Functions of `(rollouts, example)` returning one number per rollout of the group."""
    truncation_reward: float | None = None
    error_reward: float | None = 0.0
    """`"none"` (TOML has no null) grades the partial turns of ERROR / TIMEOUT / ABORTED rollouts instead."""
    timeout_s: float = Field(60.0, gt=0)
    max_abs_reward: float = Field(1e6, gt=0, le=1e30)
    """Largest |value| a reward function may return; beyond it (or NaN) the rollout is an ERROR naming the function."""

    @field_validator("error_reward", mode="before")
    @classmethod
    def _none_word(cls, value: Any) -> Any:
        return None if value == "none" else value

    @model_serializer(mode="wrap")
    def _dump_none(self, handler: Any) -> dict[str, Any]:
        data = handler(self)
        if self.error_reward is None:
            data["error_reward"] = "none"  # survives exclude_none, so the resolved config.toml keeps it
        return data

    @model_validator(mode="after")
    def _has_functions(self) -> RubricConfig:
        if not self.reward_fns and not self.group_reward_fns:
            raise ValueError("a rubric needs at least one entry in reward_fns or group_reward_fns")
        return self


class DataConfig(Section):
    """Rows of a task from local files instead of the task's own generator (`Task.load_dataset`)."""

    train: str | None = None
    """A .jsonl, .json or .parquet file; None keeps the task's own training rows."""
    validation: str | None = None
    """Same for the held-out split."""
    columns: dict[str, str] = Field(default_factory=dict)
    """Task row field -> file column, e.g. `{ question = "problem" }`; other columns keep their names."""


class TaskConfig(Section):
    name: str = "sum_digits"
    """Registered task name or import path `package.module:TaskClass`."""
    weight: float = Field(1.0, gt=0)
    """Share of training rows drawn from this task when several are configured."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the task's constructor."""
    env: RendererEnvConfig = RendererEnvConfig()
    renderer: RendererConfig = RendererConfig()
    rubric: RubricConfig | None = None
    rollout_fn: str | None = None
    """Import path `package.module:fn` of `async fn(row, context) -> Rollout | None`, one trajectory per
    call, replacing the task's environment loop (see `rollouts.fanout`); None = the task's environment."""
    data: DataConfig | None = None
    algorithm: TaskAlgorithmConfig | None = None
    """Overrides of `[algorithm]` for this task (type, teacher, sampler, ...); None = `[algorithm]` as is."""


class WandbConfig(Section):
    enabled: bool = True
    mode: Literal["offline", "online", "disabled"] = "offline"
    project: str = "rlmesh"


RankCut = Annotated[int, Field(ge=0)] | Literal["off"]


class SampleFilters(Section):
    """Which trained samples a step logs. All filters combine (AND), except that `reward_below` and
    `reward_above` set together keep either tail (reward <= below OR reward >= above)."""

    step: int = Field(1, ge=1)
    """Log samples at every N-th step only."""
    freq: float = Field(1.0, gt=0, le=1)
    """Fraction of samples kept, drawn at random seeded by `run.seed` and the step."""
    reward_below: float | None = None
    """Keep samples with reward <= this."""
    reward_above: float | None = None
    """Keep samples with reward >= this."""
    abs_advantage_above: float | None = Field(None, ge=0)
    """Keep samples with |advantage| >= this (samples that were not trained have no advantage)."""
    top_k: RankCut = 1
    """Of the samples left, keep the k with the highest reward (ties: lower episode id) ..."""
    bottom_k: RankCut = 1
    """... and the k with the lowest. "off" switches one off; both "off" keep every sample left."""
    predicate: str | None = None
    """Import path `package.module:function` of `fn(sample: dict) -> bool`; False drops the sample."""


class SampleLoggingConfig(Section):
    """Sample-level logging (seed 000): trained samples to the console, a wandb table and samples.jsonl."""

    enabled: bool = True
    filters: SampleFilters = SampleFilters()


class RunConfig(Section):
    name: str = "run"
    output_dir: str = "runs"
    """The run directory is `output_dir/name`."""
    seed: int = 0
    steps: int = Field(10, ge=0)
    groups_per_step: int = Field(8, ge=1)
    """Rollout groups (task rows) per optimizer step."""
    max_policy_staleness: int = Field(0, ge=0)
    """Most optimizer steps a group's oldest token may lag the trained policy. 0 = synchronous."""
    eval_every: int = Field(0, ge=0)
    """Validate on the held-out split every N steps (and at step 0 and at the end); 0 = never."""
    eval_groups: int | None = Field(None, ge=1)
    """Held-out rows per validation (None = the whole split), one sample each."""
    log_rollouts: bool = True
    weight_sync_timeout_s: float = Field(600.0, gt=0)
    """Longest a weight push or reload may take before the run stops with an error naming it."""
    metrics_timeout_s: float = Field(300.0, gt=0)
    """Deadline of gathering the trainer's and reward replicas' metric states at the end of a step: a trainer that
    misses it stops the run (resume from the last checkpoint); a reward replica that misses it is left out of that step."""
    reward_concurrency: int = Field(32, ge=1)
    """Most groups the RewardActor scores at once."""
    mismatch_warn_factor: float = Field(5.0, gt=1)
    """Warn when `train/mismatch_k3` exceeds this many times its first-step value (and `mismatch_warn_floor`)."""
    mismatch_warn_floor: float = Field(1e-3, ge=0)
    max_concurrent_rollouts: int = Field(64, ge=1)
    """Most rows (each a whole group) generating at once."""
    epochs: float | None = Field(None, gt=0)
    """End after this many passes over the training rows (all tasks together); None = no data limit."""
    max_rows: int | None = Field(None, ge=1)
    """End after this many training rows; with `epochs`, the smaller limit wins."""


class CheckpointConfig(Section):
    every_steps: int = Field(0, ge=0)
    """Write a checkpoint every N optimizer steps; 0 = only the final one (always written when a run ends)."""
    keep: int = Field(2, ge=1)
    """Newest committed checkpoints kept; older ones are deleted after each commit."""


class WeightSyncConfig(Section):
    transport: Literal["shared_memory", "torchstore"] = "shared_memory"
    """"shared_memory": bytes through a shared file on this host, torchstore carries a versioned handle;
    "torchstore": every tensor through the store (needed when trainer and generators are on different hosts)."""


class SlurmOptions(Section):
    """`monarch.job.SlurmJob` settings; one sbatch allocation holds every role's hosts."""

    partition: str | None = None
    time: str | None = None
    """Time limit "HH:MM:SS"; None = the partition's default."""
    account: str | None = None
    qos: str | None = None
    gpus_per_node: int | None = Field(None, ge=1)
    cpus_per_task: int | None = Field(None, ge=1)
    mem: str | None = None
    python_exe: str = "python"
    """The Python on the nodes that has rlmesh's environment (e.g. /shared/rlmesh/.venv/bin/python)."""
    job_name: str = "rlmesh"
    log_dir: str | None = None
    slurm_args: list[str] = Field(default_factory=list)
    """Extra sbatch arguments, e.g. ["--constraint=h100"]."""
    job_start_timeout: int | None = Field(None, ge=1)
    """Seconds to wait in the queue before giving up; None = wait."""


class KubernetesOptions(Section):
    """`monarch.job.KubernetesJob` settings: one MonarchMesh (pods) per role, provisioned by the MonarchMesh operator."""

    namespace: str = "default"
    image: str
    """Container image with rlmesh's environment installed."""
    gpus_per_pod: int = Field(0, ge=0)
    shared_memory_size: str | None = None
    """/dev/shm size for NCCL, e.g. "64Gi"."""
    timeout: int | None = Field(None, ge=1)
    """Seconds to wait for the pods to be ready; None = wait."""


class ClusterHosts(Section):
    """Hosts allocated per role; 0 = the role runs on the launcher's host."""

    trainer: int = Field(0, ge=0)
    generator: int = Field(0, ge=0)
    reward: int = Field(0, ge=0)
    models: int = Field(0, ge=0)
    """Hosts of the frozen models (`[models.<name>]`): every model's replicas go round-robin over them."""

    def allocated(self) -> dict[str, int]:
        """Roles that get hosts of their own, with how many."""
        return {role: count for role, count in self.model_dump().items() if count > 0}


class ClusterConfig(Section):
    """Where the roles run. `local`: all on this host. Otherwise `hosts` are allocated per role from the scheduler."""

    scheduler: Literal["local", "process", "slurm", "kubernetes"] = "local"
    hosts: ClusterHosts = ClusterHosts()
    """Hosts per role, e.g. { trainer = 1, generator = 1 }; a role left out runs on the launcher's host."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment of every process on an allocated host (they do not inherit the launcher's), e.g. HF_HOME."""
    slurm: SlurmOptions = SlurmOptions()
    kubernetes: KubernetesOptions | None = None


class Config(Section):
    model: ModelConfig = ModelConfig()
    generator: GeneratorConfig = GeneratorConfig()
    trainer: TrainerConfig = TrainerConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    models: dict[str, FrozenModelConfig] = Field(default_factory=dict)
    """Frozen models by name (teachers, samplers), each served by its own never-updated generators."""
    tasks: list[TaskConfig] = Field(default_factory=lambda: [TaskConfig()], min_length=1)
    run: RunConfig = RunConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    wandb: WandbConfig = WandbConfig()
    sample_logging: SampleLoggingConfig = SampleLoggingConfig()
    weight_sync: WeightSyncConfig = WeightSyncConfig()
    cluster: ClusterConfig = ClusterConfig()
    services: ServicesConfig = ServicesConfig()
    """Deadlines, health probes, failover and respawn of generator, frozen-model and reward replicas (README: Fault tolerance)."""

    @model_validator(mode="after")
    def _check(self) -> Config:
        names = [task.name for task in self.tasks]
        if len(set(names)) != len(names):
            raise ValueError(f"tasks: each task may appear once, got {names}")
        if self.generator.device != self.trainer.device:
            raise ValueError("generator.device and trainer.device must match on one machine")
        self._check_precision()
        for index, task in enumerate(self.tasks):
            if task.env.max_total_tokens > self.trainer.seq_len:
                raise ValueError(
                    f"tasks.{index}.env.max_total_tokens ({task.env.max_total_tokens}) exceeds "
                    f"trainer.seq_len ({self.trainer.seq_len}): such rollouts could not be trained on"
                )
            if task.env.max_total_tokens > self.generator.max_model_len:
                raise ValueError(f"tasks.{index}.env.max_total_tokens exceeds generator.max_model_len")
        from rl.algorithms.registry import check_algorithms  # the algorithm classes import torch: not at config import time

        check_algorithms(self)
        self._check_cluster()
        self._check_services()
        return self

    def _check_services(self) -> None:
        replicas = {"generator": self.generator.num_replicas, **{f"models.{name}": model.replicas for name, model in self.models.items()}}
        for role, count in replicas.items():
            needed = (self.services.models if role.startswith("models.") else self.services.generator).min_healthy_replicas
            if needed > count:
                raise ValueError(f"services: min_healthy_replicas ({needed}) exceeds the {count} replicas of {role}")

    def _check_cluster(self) -> None:
        cluster, trainer = self.cluster, self.trainer
        trainer_hosts = cluster.hosts.trainer  # 0: on the launcher's host
        if trainer.num_hosts != max(1, trainer_hosts):
            raise ValueError(f"trainer.num_hosts = {trainer.num_hosts} but the cluster gives the trainer {max(1, trainer_hosts)} host(s) (cluster.hosts.trainer)")
        if cluster.scheduler == "local" and any(count > 1 for count in cluster.hosts.allocated().values()):
            raise ValueError("cluster.scheduler = 'local' has one host; use 'process', 'slurm' or 'kubernetes' for more")
        if self.generator.num_replicas % max(1, cluster.hosts.generator):
            raise ValueError(f"generator.num_replicas ({self.generator.num_replicas}) must be a multiple of cluster.hosts.generator")
        if cluster.scheduler == "kubernetes" and cluster.kubernetes is None:
            raise ValueError("cluster.scheduler = 'kubernetes' needs a [cluster.kubernetes] section (image, namespace)")
        apart = cluster.scheduler != "local" and (trainer_hosts > 0 or cluster.hosts.generator > 0)
        if apart and self.weight_sync.transport != "torchstore":
            raise ValueError("trainer and generators on different hosts: set weight_sync.transport = 'torchstore' (shared memory is one host's)")

    def _check_precision(self) -> None:
        from rl.precision import native_bf16, resolve_compute_dtype

        trainer = self.trainer
        checkable = trainer.device == "cuda" or self.cluster.hosts.trainer == 0  # a CPU elsewhere cannot be asked from here
        native = native_bf16(trainer.device) if checkable else False
        trainer.dtype = resolve_compute_dtype(trainer.dtype, trainer.param_dtype, native)
        if trainer.dtype == "bfloat16" and trainer.device == "cpu" and checkable and not native:
            raise ValueError(
                "trainer.dtype = 'bfloat16' on a CPU without native bf16 matmuls (torch.ops.mkldnn._is_mkldnn_bf16_supported() "
                "is False: no AVX512-BF16/AMX): PyTorch falls back to its reference GEMM, measured >20x slower than fp32 "
                "(the main job's first bf16 step had not finished after 6 min; fp32 takes ~15 s). Use 'auto' or 'float32'"
            )
        if trainer.attention == "flex_attention" and trainer.device == "cpu":
            raise ValueError("trainer.attention = 'flex_attention' on CPU: FlexAttention has no backward on CPU (torch 2.13); use 'sdpa'")
        if trainer.param_dtype != "float32" and not trainer.pure_low_precision:
            raise ValueError(
                f"trainer.param_dtype = {trainer.param_dtype!r}: low-precision parameters barely train at RL learning "
                "rates (updates round away). Keep fp32 parameters and set trainer.dtype for bf16 compute, or set "
                "trainer.pure_low_precision = true to insist"
            )
        if trainer.dtype == "float16" and trainer.param_dtype != "float16":
            raise ValueError("trainer.dtype = 'float16': fp16 autocast needs loss scaling, which rlmesh does not do; use 'bfloat16'")
        if _PRECISION_BITS[trainer.dtype] > _PRECISION_BITS[trainer.param_dtype]:
            raise ValueError(f"trainer.dtype ({trainer.dtype}) is wider than trainer.param_dtype ({trainer.param_dtype})")
        if self.generator.dtype == "auto":
            self.generator.dtype = trainer.param_dtype

    @property
    def run_dir(self) -> Path:
        return Path(self.run.output_dir) / self.run.name

    def task_algorithms(self) -> dict[str, AlgorithmConfig]:
        """Each task's resolved algorithm (`[algorithm]` with the task's override applied)."""
        return {task.name: self.algorithm.for_task(task.algorithm) for task in self.tasks}


class ConfigError(ValueError):
    """A config that cannot run; the message names every bad key."""


def _parse_value(text: str) -> Any:
    """A CLI value as TOML would read it (numbers, booleans, arrays), else the plain string."""
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


def apply_override(data: dict[str, Any], dotted_key: str, value: Any) -> None:
    """Set `a.b.c = value` in nested dicts; list entries are addressed by index (`tasks.0.args.seed`)."""
    node: Any = data
    parts = dotted_key.split(".")
    for depth, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError(f"--{dotted_key}: {'.'.join(parts[:depth])} has no entry {part!r}")
            node = node[int(part)]
        else:
            if part not in node and parts[depth + 1].isdigit():
                raise ConfigError(f"--{dotted_key}: {'.'.join(parts[: depth + 1])} is not set in the config file")
            node = node.setdefault(part, {})
            if not isinstance(node, (dict, list)):
                raise ConfigError(f"--{dotted_key}: {'.'.join(parts[: depth + 1])} is not a section")
    last = parts[-1]
    if isinstance(node, list):
        if not last.isdigit() or int(last) >= len(node):
            raise ConfigError(f"--{dotted_key}: no list entry {last!r}")
        node[int(last)] = value
    else:
        node[last] = value


def _format_validation_error(error: ValidationError) -> str:
    """One line per bad key: `  trainer.lrr: Extra inputs are not permitted (got 3)`."""
    lines = []
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "<config>"
        value = item.get("input")
        shown = "" if item["type"] == "missing" or isinstance(value, dict) else f" (got {value!r})"
        message = item["msg"].removeprefix("Value error, ")
        lines.append(f"  {message}" if key == "<config>" else f"  {key}: {message}{shown}")
    return "invalid config:\n" + "\n".join(lines)


def load_config(path: str | Path | None = None, overrides: dict[str, str] | None = None) -> Config:
    """Read a TOML file (optional), apply dotted `key -> value text` overrides, validate."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"config file not found: {path}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    for dotted_key, text in (overrides or {}).items():
        apply_override(data, dotted_key, _parse_value(text))
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc)) from None


def dump_toml(config: Config) -> str:
    """The resolved config as TOML (None values omitted: TOML has no null)."""
    import tomli_w

    return tomli_w.dumps(config.model_dump(mode="json", exclude_none=True))
