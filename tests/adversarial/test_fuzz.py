"""Property tests with a fixed example budget: bad configs, random tokens and random replies never crash.

- any generated bad config is rejected by `rlmesh validate` with exit 2 and the offending key named;
- random token sequences through the renderer's parse never raise out of `RendererEnv`;
- reward functions fed random replies never crash the rubric.
"""

import asyncio
import contextlib
import io
import tempfile
from pathlib import Path
from typing import Any

import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from env_types.renderer import build_renderer
from rl.commands.cli import main
from rl.config import Config
from rl.config.tasks import RendererConfig, RendererEnvConfig
from rollouts.renderer_env import RendererEnv
from rollouts.types import Completion, Rollout, RolloutStatus, RolloutTurn
from tasks.sum_digits import SumDigitsTask

BUDGET = settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
DEFAULT = Config().model_dump(mode="json", exclude_none=True)


def leaf_paths(data: Any, prefix: tuple = ()) -> list[tuple]:
    if isinstance(data, dict):
        return [path for key, value in data.items() for path in leaf_paths(value, (*prefix, key))]
    if isinstance(data, list) and data and all(isinstance(item, dict) for item in data):
        return [path for index, item in enumerate(data) for path in leaf_paths(item, (*prefix, index))]
    return [prefix]


def section_paths(data: Any, prefix: tuple = ()) -> list[tuple]:
    if isinstance(data, dict):
        return [prefix] + [path for key, value in data.items() for path in section_paths(value, (*prefix, key))]
    if isinstance(data, list):
        return [path for index, item in enumerate(data) for path in section_paths(item, (*prefix, index))]
    return []


LEAVES = leaf_paths(DEFAULT)
# task args are free-form; [models.<name>] are named by the user
SECTIONS = [path for path in section_paths(DEFAULT) if not path or path[-1] not in ("args", "models", "env")]
BAD_VALUES = st.one_of(
    st.text(max_size=5).map(lambda text: f"x{text}"),
    st.just(-7),
    st.just(-0.5),
    st.just(10**12),
    st.just([1, "a"]),
    st.just({"k": 1}),
)


def get_path(data: Any, path: tuple) -> Any:
    for part in path:
        data = data[part]
    return data


def set_path(data: Any, path: tuple, value: Any) -> None:
    for part in path[:-1]:
        data = data[part]
    data[path[-1]] = value


def validate(data: dict) -> tuple[int, str]:
    with tempfile.TemporaryDirectory() as folder:
        config_file = Path(folder) / "config.toml"
        config_file.write_text(tomli_w.dumps(data))
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(["validate", "--config", str(config_file)])
    return code, err.getvalue()


def dotted(path: tuple) -> str:
    return ".".join(str(part) for part in path)


DEFAULT_AT = {path: get_path(DEFAULT, path) for path in LEAVES}
FREE_TEXT = {
    "algorithm.demo_key",
    "run.name",
    "run.output_dir",
    "wandb.project",
    "cluster.slurm.python_exe",
    "cluster.slurm.job_name",
}
"""Names, paths and row keys: any text is one (a path that does not exist yet is made by the run)."""
SIGNED = {"run.seed", "generator.seed", "trainer.seed", "run.eval_pass_threshold"}
"""Numbers whose negative values mean something (a seed, a reward threshold)."""


def admits(key: str, value: Any, default: Any) -> bool:
    """Whether `value` is a legitimate value of config key `key` (whose default is `default`), by the keys' meaning,
    written here independently of the config's own validation: free text where the key is a name or path, a negative
    number where the key is signed, a huge count or duration where it has no upper bound (every numeric key)."""
    if isinstance(value, str):
        return key in FREE_TEXT
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if value < 0:
        return key in SIGNED and (isinstance(value, int) or isinstance(default, float))
    return isinstance(default, int | float) and not isinstance(default, bool)


@BUDGET
@given(path=st.sampled_from(LEAVES), value=BAD_VALUES)
def test_ill_typed_or_out_of_range_values_are_rejected_naming_the_key(path, value):
    data = Config().model_dump(mode="json", exclude_none=True)
    set_path(data, path, value)
    code, err = validate(data)
    assert "Traceback" not in err
    if code == 0:  # only where the value is one the key admits
        assert admits(dotted(path), value, DEFAULT_AT[path]), f"validate accepted {dotted(path)} = {value!r}"
    else:
        assert code == 2
        assert dotted(path) in err or (path[-1] in err), err  # a cross-field message names the key itself


@BUDGET
@given(section=st.sampled_from(SECTIONS), key=st.from_regex(r"[a-z][a-z_]{0,11}", fullmatch=True))
def test_unknown_keys_at_any_depth_are_rejected_naming_them(section, key):
    data = Config().model_dump(mode="json", exclude_none=True)
    node = data
    for part in section:
        node = node[part]
    if key in node:
        return
    node[key] = 1
    code, err = validate(data)
    assert code == 2 and "Traceback" not in err
    assert f"{dotted((*section, key))}: Extra inputs are not permitted" in err


@BUDGET
@given(prompt=st.integers(1, 4096), total=st.integers(1, 4096), seq_len=st.integers(8, 4096), group=st.integers(0, 4))
def test_contradictory_limits_are_rejected_without_a_traceback(prompt, total, seq_len, group):
    data = Config().model_dump(mode="json", exclude_none=True)
    data["tasks"][0]["env"].update(max_prompt_tokens=prompt, max_total_tokens=total)
    data["trainer"]["seq_len"] = seq_len
    data["algorithm"]["group_size"] = group
    code, err = validate(data)
    valid = prompt < total <= min(seq_len, data["generator"]["max_model_len"]) and group >= 2
    assert code == (0 if valid else 2) and "Traceback" not in err, err


class OneReplyEnv:
    async def reset(self):
        from env_types.message_env import ResetOutput

        return ResetOutput(messages=[{"role": "user", "content": "Say something."}])

    async def step(self, assistant_message):
        from env_types.message_env import StepOutput

        return StepOutput(done=True)

    async def close(self):
        return None


RENDERER = build_renderer(RendererConfig(name="qwen3"), "tiny-qwen3")


@settings(max_examples=80, deadline=None, derandomize=True)
@given(token_ids=st.lists(st.integers(0, 151_668), max_size=40), finish=st.sampled_from(["stop", "length", "abort"]))
def test_random_tokens_never_raise_out_of_the_renderer_env(token_ids, finish):
    async def run() -> Rollout:
        rollout = Rollout(rollout_id="r", group_id="g", task_name="t", sample_index=0)
        env = RendererEnv(OneReplyEnv(), RENDERER, RendererEnvConfig(max_turns=1), rollout)
        await env.start()
        await env.step(
            Completion(token_ids=token_ids, logprobs=[-1.0] * len(token_ids), finish_reason=finish, policy_version=0)
        )
        return rollout

    rollout = asyncio.run(run())
    assert rollout.status.is_terminal()
    assert rollout.turns[0].completion_token_ids == token_ids  # recorded exactly, whatever it parses to
    if rollout.status is RolloutStatus.ERROR:
        assert rollout.error


@settings(max_examples=80, deadline=None, derandomize=True)
@given(reply=st.text(max_size=60))
def test_reward_functions_fed_random_replies_never_crash_the_rubric(reply):
    task = SumDigitsTask()
    example = task.load_dataset("train")[0]
    rollout = Rollout(
        rollout_id="r",
        group_id="g",
        task_name="sum_digits",
        sample_index=0,
        status=RolloutStatus.COMPLETED,
        turns=[
            RolloutTurn(
                prompt_messages=[], prompt_token_ids=[1], assistant_message={"role": "assistant", "content": reply}
            )
        ],
    )
    [reward] = asyncio.run(task.build_rubric().score_group([rollout], example))
    assert reward.error is None and 0.0 <= reward.total <= 2.0 and set(reward.components) == {"digit_sum_correct"}
