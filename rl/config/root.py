"""The whole `Config` of a run, read from TOML and dotted CLI overrides (`load_config`), and its resolved dump.

Every section forbids unknown keys and checks types, so a typo or a wrong type fails before any actor starts,
with the offending key named (`trainer.lrr: Extra inputs are not permitted`). Device, dtype and parallelism are
plain fields: the GPU paths are selected here, not by code edits. What needs the runtime to check or decide
(algorithm classes, native bf16, model and renderer names, bypass mode) is `rl.loop.resolve.resolve_config`'s,
which every entry point runs after loading.
"""

from __future__ import annotations

import difflib
import tomllib
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, model_validator

from rl.config.algorithm import POLICY, AlgorithmConfig, task_algorithm_key
from rl.config.cluster import ClusterConfig
from rl.config.loss import LossConfig
from rl.config.metrics import SampleLoggingConfig, WandbConfig
from rl.config.roles import FrozenModelConfig, GeneratorConfig, ModelConfig, TrainerConfig, WeightSyncConfig
from rl.config.run import CheckpointConfig, RunConfig
from rl.config.section import Section
from rl.config.services import ServicesConfig
from rl.config.tasks import TaskConfig

_PRECISION_BITS = {"float32": 24, "bfloat16": 8, "float16": 11}
COLOCATED_MEMORY = 0.92
"""The share of one GPU a colocated trainer and generator may plan for together."""


class Config(Section):
    model: ModelConfig = ModelConfig()
    """The policy: the model that is trained and sampled."""
    generator: GeneratorConfig = GeneratorConfig()
    """The policy's generators: vLLM engines that sample the rollouts and reload the new weights after every step."""
    trainer: TrainerConfig = TrainerConfig()
    """The policy's trainer: its precision, optimizer (AdamW), LR schedule, batch packing and ranks."""
    loss: LossConfig = LossConfig()
    """The trainer's loss, for every task alike: policy loss, clipping, aggregation, KL, rollout correction."""
    algorithm: AlgorithmConfig = AlgorithmConfig()
    """How scored groups become training samples (every task's default; a task may override the credit)."""
    models: dict[str, FrozenModelConfig] = Field(default_factory=dict)
    """Frozen models by name (teachers, samplers), each served by its own never-updated generators."""
    tasks: list[TaskConfig] = Field(default_factory=lambda: [TaskConfig()], min_length=1)
    """What the run trains on: one entry per task, their training rows mixed by `weight`."""
    run: RunConfig = RunConfig()
    """Length, seeds, evaluation, concurrency, staleness and deadlines of the run."""
    checkpoint: CheckpointConfig = CheckpointConfig()
    """When checkpoints are written and how many are kept."""
    wandb: WandbConfig = WandbConfig()
    """The wandb backend of the metrics (offline by default)."""
    sample_logging: SampleLoggingConfig = SampleLoggingConfig()
    """Which trained samples are logged to the console, a wandb table and `samples.jsonl`."""
    weight_sync: WeightSyncConfig = WeightSyncConfig()
    """How new weights move from the trainer to the generators."""
    cluster: ClusterConfig = ClusterConfig()
    """Where the roles run: this host, local processes, Slurm or Kubernetes."""
    services: ServicesConfig = ServicesConfig()
    """Deadlines, health probes, failover and respawn of generator, frozen-model and reward replicas (docs/checkpoints.md, "Fault tolerance")."""

    @model_validator(mode="after")
    def _check(self) -> Config:
        keys = [task.key for task in self.tasks]
        for index, key in enumerate(keys):
            if key in keys[:index]:
                first = keys.index(key)
                raise ValueError(
                    f"tasks.{index}: named {key!r} in metric keys like tasks.{first}; give one of them its own "
                    f'short name: tasks.{index}.alias = "..." (a task class can be listed twice, each under its name)'
                )
        if self.generator.device != self.trainer.device:
            raise ValueError("generator.device and trainer.device must match on one machine")
        self._check_precision()
        if self.trainer.lora.enabled and self.trainer.ranks > 1:
            raise ValueError(
                f"trainer.lora.enabled with {self.trainer.ranks} trainer ranks (FSDP2) is not supported yet: "
                "set trainer.num_procs = 1 and trainer.num_hosts = 1"
            )
        if self.trainer.lora.enabled and self.weight_sync.attest and self.generator.tensor_parallel_size > 1:
            raise ValueError(
                f"trainer.lora.enabled with generator.tensor_parallel_size = {self.generator.tensor_parallel_size}: "
                "attesting an adapter split across tensor-parallel workers is not supported yet; set "
                "generator.tensor_parallel_size = 1 (or weight_sync.attest = false)"
            )
        if self.run.eval_samples_per_row > 1 and self.generator.eval_sampling.temperature == 0:
            raise ValueError(
                f"run.eval_samples_per_row = {self.run.eval_samples_per_row} samples greedily would give the same "
                "answer each time: set generator.eval_sampling.temperature above 0"
            )
        for index, task in enumerate(self.tasks):
            if task.env.max_total_tokens > self.trainer.seq_len:
                raise ValueError(
                    f"tasks.{index}.env.max_total_tokens ({task.env.max_total_tokens}) exceeds "
                    f"trainer.seq_len ({self.trainer.seq_len}): such rollouts could not be trained on"
                )
            if task.env.max_total_tokens > self.generator.max_model_len:
                raise ValueError(f"tasks.{index}.env.max_total_tokens exceeds generator.max_model_len")
        self._check_models()
        self._check_cluster()
        self._check_services()
        return self

    def _check_models(self) -> None:
        """Frozen models and the tasks' teachers and samplers name each other consistently."""
        if POLICY in self.models:
            raise ValueError(f"models.{POLICY}: the name {POLICY!r} is reserved for the trained policy")
        for index, task in enumerate(self.tasks):
            algorithm = self.algorithm.for_task(task.algorithm)
            where = task_algorithm_key(index, task.algorithm)
            for key in ("teacher", "sampler"):
                name = getattr(algorithm, key)
                if name is not None and name != POLICY and name not in self.models:
                    raise ValueError(
                        f"{where}.{key} = {name!r} is not a declared model (known: {sorted(self.models)} or 'policy')"
                    )

    def _check_services(self) -> None:
        replicas = {
            "generator": self.generator.num_replicas,
            **{f"models.{name}": model.replicas for name, model in self.models.items()},
        }
        for role, count in replicas.items():
            needed = (
                self.services.models if role.startswith("models.") else self.services.generator
            ).min_healthy_replicas
            if needed > count:
                raise ValueError(f"services: min_healthy_replicas ({needed}) exceeds the {count} replicas of {role}")

    def _check_cluster(self) -> None:
        cluster, trainer = self.cluster, self.trainer
        trainer_hosts = cluster.hosts.trainer  # 0: on the launcher's host
        if trainer.num_hosts != max(1, trainer_hosts):
            raise ValueError(
                f"trainer.num_hosts = {trainer.num_hosts} but the cluster gives the trainer {max(1, trainer_hosts)} host(s) (cluster.hosts.trainer)"
            )
        many = {role: count for role, count in cluster.hosts.allocated().items() if count > 1}
        if cluster.scheduler == "local" and many:
            role, count = next(iter(many.items()))
            raise ValueError(
                f"cluster.hosts.{role} = {count}, but cluster.scheduler = 'local' has one host; "
                "use 'process', 'attach', 'slurm' or 'kubernetes' for more"
            )
        if self.generator.num_replicas % max(1, cluster.hosts.generator):
            raise ValueError(
                f"generator.num_replicas ({self.generator.num_replicas}) must be a multiple of cluster.hosts.generator"
            )
        if cluster.scheduler == "attach":
            counts = {role: len(addresses) for role, addresses in cluster.workers.items()}
            if counts != cluster.hosts.allocated():
                raise ValueError(
                    f"cluster.scheduler = 'attach': cluster.workers lists {counts} worker address(es) per role, "
                    f"cluster.hosts gives {cluster.hosts.allocated()}; list one address per host of each role"
                )
        elif cluster.workers:
            raise ValueError(f"cluster.workers is for scheduler 'attach', not {cluster.scheduler!r}")
        if cluster.scheduler == "kubernetes" and cluster.kubernetes is None:
            raise ValueError("cluster.scheduler = 'kubernetes' needs a [cluster.kubernetes] section (image, namespace)")
        self._check_colocation()
        apart = cluster.scheduler != "local" and (trainer_hosts > 0 or cluster.hosts.generator > 0)
        if apart and self.weight_sync.transport != "torchstore":
            raise ValueError(
                "trainer and generators on different hosts: set weight_sync.transport = 'torchstore' (shared memory is one host's)"
            )

    def _check_colocation(self) -> None:
        generator, trainer = self.generator, self.trainer
        if not generator.colocate_with_trainer:
            return
        if generator.device != "cuda":
            raise ValueError("generator.colocate_with_trainer is for GPUs (generator.device = 'cuda')")
        if self.cluster.hosts.generator > 0 or self.cluster.hosts.trainer > 0:
            raise ValueError(
                "generator.colocate_with_trainer: trainer and generators must both run on the launcher's host"
            )
        if trainer.gpu_memory_fraction is None:
            raise ValueError(
                "generator.colocate_with_trainer: set trainer.gpu_memory_fraction too, so the trainer leaves the "
                f"generator its generator.gpu_memory_utilization = {generator.gpu_memory_utilization} of the GPU"
            )
        if trainer.gpu_memory_fraction + generator.gpu_memory_utilization > COLOCATED_MEMORY:
            raise ValueError(
                f"trainer.gpu_memory_fraction ({trainer.gpu_memory_fraction}) + generator.gpu_memory_utilization "
                f"({generator.gpu_memory_utilization}) exceeds {COLOCATED_MEMORY} of one GPU (the rest: CUDA contexts, "
                "NCCL, fragmentation)"
            )

    def _check_precision(self) -> None:
        """The precision rules that need no hardware; "auto" and native bf16 are the run's to decide
        (`rl.loop.resolve`)."""
        trainer = self.trainer
        if trainer.attention == "flex_attention" and trainer.device == "cpu":
            raise ValueError(
                "trainer.attention = 'flex_attention' on CPU: FlexAttention has no backward on CPU (torch 2.13); use 'sdpa'"
            )
        if trainer.param_dtype != "float32" and not trainer.pure_low_precision:
            raise ValueError(
                f"trainer.param_dtype = {trainer.param_dtype!r}: low-precision parameters barely train at RL learning "
                "rates (updates round away). Keep fp32 parameters and set trainer.dtype for bf16 compute, or set "
                "trainer.pure_low_precision = true to insist"
            )
        if trainer.dtype == "float16" and trainer.param_dtype != "float16":
            raise ValueError(
                "trainer.dtype = 'float16': fp16 autocast needs loss scaling, which rlmesh does not do; use 'bfloat16'"
            )
        if trainer.dtype != "auto" and _PRECISION_BITS[trainer.dtype] > _PRECISION_BITS[trainer.param_dtype]:
            raise ValueError(
                f"trainer.dtype ({trainer.dtype}) is wider than trainer.param_dtype ({trainer.param_dtype})"
            )

    @property
    def run_dir(self) -> Path:
        return Path(self.run.output_dir) / self.run.name

    def task_algorithms(self) -> dict[str, AlgorithmConfig]:
        """Each task's resolved algorithm (`[algorithm]` with the task's override applied)."""
        return {task.key: self.algorithm.for_task(task.algorithm) for task in self.tasks}


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
        if item["type"] == "extra_forbidden" and (
            close := difflib.get_close_matches(str(item["loc"][-1]), _fields_at(item["loc"][:-1]), n=1)
        ):
            message += f"; did you mean {close[0]!r}?"
        lines.append(f"  {message}" if key == "<config>" else f"  {key}: {message}{shown}")
    return "invalid config:\n" + "\n".join(lines)


def _fields_at(loc: tuple[Any, ...]) -> list[str]:
    """The field names of the section at `loc` (list indices and `[models.<name>]` keys stepped over), for "did you mean"."""
    model: Any = Config
    for part in loc:
        if part in getattr(model, "model_fields", {}):  # else a list index or a key of a dict of sections
            model = _section_of(model.model_fields[part].annotation)
    return list(getattr(model, "model_fields", {}))


def _section_of(annotation: Any) -> Any:
    """The section class inside a field's type (`X | None`, `list[X]`, `dict[str, X]`), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in typing.get_args(annotation):
        if (found := _section_of(argument)) is not None:
            return found
    return None


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
