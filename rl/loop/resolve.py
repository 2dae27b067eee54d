"""The one step after loading a config that needs the runtime: checks that import the algorithm classes, the policy
loss (`loss.type`), the model assets, the renderers or torch (prefix sharing against the model's layers, the frozen models' tokenizers), and the
values the run decides (compute dtype, sampler dtype, bypass mode and the token IS that comes with it).

`rlmesh validate`, `rlmesh train`, `rlmesh bench` and the Python API (`Controller`) all run it, so no path skips it;
`rl.config` itself stays free of runtime code. It is idempotent: a resolved config resolves to itself.
"""

from __future__ import annotations

import json
from pathlib import Path

from env_types.renderer import check_renderer_name, load_tokenizer
from rl.algorithms.registry import check_algorithms
from rl.assets import BUILTIN_MODELS, check_model_path
from rl.components import TASKS, resolve
from rl.config import Config, ConfigError
from rl.config.correction import decide_bypass_mode
from rl.packing.attention_kinds import prefix_sharing_refusal
from rl.precision import native_bf16, resolve_precision
from rl.training.losses import policy_loss_fn


def resolve_config(config: Config) -> Config:
    """A copy of `config` checked against the runtime and with every "auto" and unset decision made.

    Raises `ConfigError` naming the key, as `load_config` does for what the config alone can tell."""
    resolved = config.model_copy(deep=True)
    try:
        _check_names(resolved)
        check_algorithms(resolved)
        _check_loss(resolved)
        _check_prefix_sharing(resolved)
        if mismatches := tokenizer_mismatches(resolved):
            raise ValueError("\n  ".join(mismatches))
        _resolve_precision(resolved)
        decide_bypass_mode(resolved)  # after the dtypes: the rule compares them
    except ValueError as exc:
        raise ConfigError(f"invalid config:\n  {exc}") from None
    return resolved


def _check_loss(config: Config) -> None:
    """`loss.type` is a registered policy loss or imports as a function (`rl.training.losses.policy_loss_fn`)."""
    try:
        policy_loss_fn(config.loss.type)
    except ValueError as exc:
        raise ValueError(f"loss.type: {exc}") from None


def _check_names(config: Config) -> None:
    """Model paths are built-in assets, directories or hub ids; task names are registered or import paths; renderer
    names are known to `renderers`."""
    paths = {"model.path": config.model.path} | {f"models.{name}.path": m.path for name, m in config.models.items()}
    loaded_here = config.cluster.hosts.trainer == 0  # hosts of a cluster may have the model in their own cache
    for key, path in paths.items():
        try:
            check_model_path(path, loaded_here=loaded_here)
        except ValueError as exc:
            raise ValueError(f"{key}: {exc}") from None
    for index, task in enumerate(config.tasks):
        try:
            resolve(task.name, TASKS, "task")
        except ValueError as exc:
            raise ValueError(f"tasks.{index}.name: {exc}") from None
        try:
            check_renderer_name(task.renderer.name)
        except ValueError as exc:
            raise ValueError(f"tasks.{index}.renderer.name: {exc}") from None


def _resolve_precision(config: Config) -> None:
    """`trainer.dtype` and `generator.dtype` "auto" by the trainer's hardware (`rl.precision.resolve_precision`),
    refusing bf16 where the trainer's CPU has no native bf16 matmuls."""
    trainer = config.trainer
    checkable = trainer.device == "cuda" or config.cluster.hosts.trainer == 0  # a CPU elsewhere cannot be asked
    native = native_bf16(trainer.device) if checkable else False
    trainer.dtype, config.generator.dtype = resolve_precision(
        trainer.dtype, config.generator.dtype, trainer.param_dtype, native
    )
    if trainer.dtype == "bfloat16" and trainer.device == "cpu" and checkable and not native:
        raise ValueError(
            "trainer.dtype = 'bfloat16' on a CPU without native bf16 matmuls (torch.ops.mkldnn._is_mkldnn_bf16_supported() "
            "is False: no AVX512-BF16/AMX): PyTorch falls back to its reference GEMM, measured >20x slower than fp32 "
            "(the main job's first bf16 step had not finished after 6 min; fp32 takes ~15 s). Use 'auto' or 'float32'"
        )


def _check_prefix_sharing(config: Config) -> None:
    """Refuse `trainer.prefix_sharing` for a `model.path` whose layers ignore the tree mask, read from the model's
    local `config.json` (a hub id not downloaded yet: the trainer checks when it loads the model). The built-in
    models are softmax attention."""
    if not config.trainer.prefix_sharing or config.model.path in BUILTIN_MODELS:
        return
    config_file = Path(config.model.path) / "config.json"
    if config_file.is_file() and (
        refusal := prefix_sharing_refusal(json.loads(config_file.read_text()), config.model.path)
    ):
        raise ValueError(refusal)


def tokenizer_mismatches(config: Config) -> list[str]:
    """The frozen models whose token ids reach the policy's loss (a task's `teacher`, or its `sampler`) but whose
    tokenizer is not the policy's (their token ids would mean other tokens to the policy); one message each, naming
    the key."""

    def vocabulary(path: str) -> dict[str, int]:
        return load_tokenizer(path).get_vocab()  # added tokens included

    uses: dict[str, list[str]] = {}
    for index, (task, algorithm) in enumerate(zip(config.tasks, config.task_algorithms().values())):
        for role in ("teacher", "sampler"):
            name = getattr(algorithm, role)
            if name is not None and name in config.models:
                uses.setdefault(name, []).append(f"tasks.{index} ({task.name})'s {role}")
    if not uses:
        return []
    policy = vocabulary(config.model.path)
    problems = []
    for name, roles in uses.items():
        frozen = vocabulary(config.models[name].path)
        if frozen == policy:
            continue
        differ = sorted(token for token in frozen.keys() | policy.keys() if frozen.get(token) != policy.get(token))
        problems.append(
            f"[models.{name}] ({config.models[name].path}), {' and '.join(roles)}, does not share the policy's "
            f"tokenizer ({config.model.path}): {len(differ)} tokens differ (vocabularies of {len(frozen)} and "
            f"{len(policy)}, e.g. {differ[0]!r}); its token ids would mean other tokens to the policy"
        )
    return problems
