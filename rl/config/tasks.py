"""A task entry of the run: which task, its data, its rubric, its renderer and the limits of its rollouts."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_serializer, model_validator

from rl.config.algorithm import TaskAlgorithmConfig
from rl.config.section import Section


class RendererConfig(Section):
    """Which chat renderer to build for a model (`env_types.renderer.build_renderer`)."""

    name: str = "auto"
    """A `renderers` config name ("qwen3", "default", "llama-3", ...) or "auto"."""
    enable_thinking: bool = False
    """The `enable_thinking` template kwarg, for the renderers and templates that have one."""
    preserve_thinking_between_tool_calls: bool = False
    """Keep the reasoning the policy sampled in earlier turns of the current tool cycle in later prompts: each
    prompt after a tool result extends the previous one token for token, and a new user query re-renders the
    history (the template's own retention). renderers 0.1.12 calls this `thinking_retention = "tool_cycle"`;
    off, each renderer follows its template's knobs. The default renderer (a bare Jinja template) cannot."""


class RendererEnvConfig(Section):
    """Limits of one rollout."""

    max_prompt_tokens: int = Field(512, gt=0)
    """A prompt longer than this ends the rollout without generating (PROMPT_OVERFLOW)."""
    max_new_tokens: int = Field(256, gt=0)
    """Most tokens one assistant turn may generate."""
    max_total_tokens: int = Field(1024, gt=0)
    """Most tokens of the whole conversation (prompt + all completions); bounds training length."""
    max_turns: int = Field(1, gt=0)
    """Most assistant turns of one rollout; the environment may end it earlier (`StepOutput(done=True)`)."""
    env_timeout_s: float = Field(30.0, gt=0)
    """Longest an environment `reset` or `step` may take before the rollout becomes TIMEOUT."""

    @model_validator(mode="after")
    def _prompt_leaves_room(self) -> RendererEnvConfig:
        if self.max_prompt_tokens >= self.max_total_tokens:
            raise ValueError(
                f"max_prompt_tokens ({self.max_prompt_tokens}) must be below max_total_tokens ({self.max_total_tokens}): "
                "a prompt that long leaves no room to generate"
            )
        return self


class RubricConfig(Section):
    """Replaces a task's default rubric."""

    class RewardFnEntry(Section):
        fn: str
        """Registered name or import path `package.module:function`."""
        weight: float = Field(1.0, ge=0)
        """Relative weight: the weights of all of a rubric's functions (plain and group) are normalised to sum 1."""
        name: str = ""
        """Key of the component in metrics (`reward/<name>`) and sample logs; "" = the function's name."""
        args: dict[str, Any] = Field(default_factory=dict)
        """Keyword arguments bound to the function (`functools.partial`), e.g. `{ tolerance = 0.01 }`."""

    reward_fns: list[RewardFnEntry] = Field(default_factory=list)
    """Functions of `(rollout, example)` returning a number; the reward is the weighted mean of these and the group
    functions: sum(weight * value) / sum(weight), so it stays in the range of its components (a right answer with a
    shaping term below 1 scores below 1: mind `run.eval_pass_threshold`)."""
    group_reward_fns: list[RewardFnEntry] = Field(default_factory=list)
    """Functions of `(rollouts, example)` returning one number per rollout of the group."""
    truncation_reward: float | None = None
    """Reward of TRUNCATED and PROMPT_OVERFLOW rollouts, given without running the functions; None scores the cut
    reply as it is."""
    error_reward: float | None = 0.0
    """Reward of ERROR / TIMEOUT / ABORTED rollouts (given without running the functions) and of a rollout whose
    reward function failed; `"none"` (TOML has no null) grades the partial turns of those rollouts instead."""
    timeout_s: float = Field(60.0, gt=0)
    """Longest one reward function may take on one rollout (a group function: on the group); past it the rollout is
    TIMEOUT."""
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
    alias: str | None = Field(None, pattern=r"^[A-Za-z0-9_.-]+$")
    """Short name of this entry in metric keys, rollouts and sample logs (`reward/<alias>/mean`), so one task class can
    be listed twice (two datasets, two arg sets) under two names; None = the registered name, or the class name of an
    import path (`my_tasks.vowels:VowelsTask` → `VowelsTask`)."""
    weight: float = Field(1.0, gt=0)
    """Share of training rows drawn from this task when several are configured."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the task's constructor."""
    env: RendererEnvConfig = RendererEnvConfig()
    """Limits of one rollout: prompt, completion and conversation tokens, turns, the environment's deadline."""
    renderer: RendererConfig = RendererConfig()
    """The chat renderer that turns messages into tokens and sampled tokens back into messages."""
    rubric: RubricConfig | None = None
    """Replaces the task's own rubric (`Task.build_rubric`); None = the task's."""
    rollout_fn: str | None = None
    """Import path `package.module:fn` of `async fn(row, context) -> Rollout | None`, one trajectory per
    call, replacing the task's environment loop (see `rollouts.fanout`); None = the task's environment."""
    data: DataConfig | None = None
    """Rows from local files instead of the task's own; None = the task's."""
    algorithm: TaskAlgorithmConfig | None = None
    """Overrides of `[algorithm]` for this task (type, teacher, sampler, ...); None = `[algorithm]` as is."""

    @property
    def key(self) -> str:
        """This entry's name wherever the run names its tasks (metric keys, rollouts, logs): `alias`, else `name`
        without its module path."""
        return self.alias or self.name.rpartition(":")[2]
