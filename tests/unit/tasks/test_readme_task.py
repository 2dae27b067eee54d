"""The task example of docs/writing-a-task.md, taken from the page itself, works as a user's own package."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from env_types.renderer import build_renderer
from rl.assets import resolve_model_path
from rl.config.tasks import RendererConfig, RendererEnvConfig
from rollouts.fanout import RolloutContext, rollout_group, task_rollout
from rollouts.types import Completion, RolloutStatus
from rubrics.rubric import apply_reward
from tests.support.paths import REPO

pytestmark = pytest.mark.processes  # the page's configs validated in child processes


def page_blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", (REPO / "docs" / "writing-a-task.md").read_text(), flags=re.S)


def write_user_package(root: Path) -> None:
    [task_code] = [block for block in page_blocks("python") if "class LargerTask" in block]
    [rollout_code] = [block for block in page_blocks("python") if "async def skip_close_pairs" in block]
    (root / "my_tasks").mkdir()
    (root / "my_tasks" / "__init__.py").write_text("")
    (root / "my_tasks" / "larger.py").write_text(task_code)
    (root / "my_tasks" / "rollouts.py").write_text(rollout_code)


def test_readme_task_configs_validate_by_import_path(tmp_path):
    write_user_package(tmp_path)
    task_tomls = [block for block in page_blocks("toml") if "my_tasks.larger:LargerTask" in block]
    assert len(task_tomls) == 2  # the task, and the task with its own rollout_fn
    for index, task_toml in enumerate(task_tomls):
        config = tmp_path / f"larger{index}.toml"
        config.write_text('[model]\npath = "tiny-qwen3"\n' + task_toml)
        result = subprocess.run(
            [sys.executable, "-m", "rl.commands.cli", "validate", "--config", str(config)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env={"PYTHONPATH": f"{tmp_path}:{REPO}", "PATH": ""},
        )
        assert result.returncode == 0, result.stderr
        assert 'name = "my_tasks.larger:LargerTask"' in result.stdout
    assert 'rollout_fn = "my_tasks.rollouts:skip_close_pairs"' in result.stdout


async def test_readme_task_rolls_out_and_scores(tmp_path, monkeypatch):
    write_user_package(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    from my_tasks.larger import LargerTask

    task = LargerTask(num_rows=10, num_validation=1)
    [row] = task.load_dataset("validation")
    renderer = build_renderer(RendererConfig(name="qwen3"), "tiny-qwen3")
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("tiny-qwen3"))
    larger, smaller = row["larger"], min(row["a"], row["b"])

    async def rewards_of(reply: str) -> list[tuple[RolloutStatus, float]]:
        answer = tokenizer.encode(reply + "<|im_end|>")

        async def generate(request):
            return Completion(token_ids=answer, logprobs=[-0.1] * len(answer), finish_reason="stop", policy_version=0)

        def context(index):
            return RolloutContext("g", index, "larger", task, renderer, RendererEnvConfig(max_new_tokens=16), generate)

        group = await rollout_group("g", "larger", row, 2, task_rollout, context)
        for rollout, reward in zip(
            group.rollouts, await task.build_rubric().score_group(group.rollouts, group.example)
        ):
            apply_reward(rollout, reward)
        return [(r.status, r.reward) for r in group.rollouts]

    assert await rewards_of(f"{larger} is larger than {smaller}.") == [(RolloutStatus.COMPLETED, 1.0)] * 2
    assert await rewards_of(f"{smaller} is smaller than {larger}.") == [(RolloutStatus.COMPLETED, 0.0)] * 2
