"""`rlmesh new-task NAME`: a task package to start from, with a config and a test that runs it."""

from __future__ import annotations

import keyword
from pathlib import Path

_TASK = '''"""{title}: what the model is asked, how the answer is graded."""

from __future__ import annotations

import random
from typing import Any

from env_types.message_env import MessageEnv, ResetOutput, StepOutput
from rollouts.types import Message, Rollout
from rubrics.builtins import exact_match
from rubrics.rubric import RewardFn, Rubric
from tasks.task import Split, Task


def shows_work(rollout: Rollout, example: dict[str, Any]) -> float:
    """A reward function: (rollout, example) -> float; may be `async def` (a judge, a sandbox)."""
    return float(len(rollout.last_assistant_text().split()) > 1)


class {env_class}(MessageEnv):
    """One conversation. `reset` gives the first messages; `step` answers each assistant message."""

    def __init__(self, question: str):
        self.question = question

    async def reset(self) -> ResetOutput:
        return ResetOutput(messages=[{{"role": "user", "content": self.question}}])

    async def step(self, assistant_message: Message) -> StepOutput:
        # Single turn. For more turns return StepOutput(messages=[...], done=False); for tools
        # subclass tools.tool.ToolEnv instead of MessageEnv.
        return StepOutput(done=True)


class {task_class}(Task):
    """Rows `{{question, answer}}`, from a file with the config's `data` table or made here. The rows made here are a
    placeholder that runs as is: sums of two numbers. Replace them with {title}'s own questions and answers."""

    row_fields = ("question", "answer")

    def __init__(self, num_train: int = 200, num_validation: int = 20, seed: int = 0):
        pairs = [(a, b) for a in range(1, 51) for b in range(1, 51)]
        chosen = random.Random(seed).sample(pairs, num_train + num_validation)  # no row twice: the splits are disjoint
        rows = [
            {{"question": f"What is {{a}} + {{b}}? Reply with just the number.", "answer": str(a + b)}} for a, b in chosen
        ]
        self.splits = {{"validation": rows[:num_validation], "train": rows[num_validation:]}}

    def load_dataset(self, split: Split) -> list[dict[str, Any]]:
        return [dict(row) for row in self.splits[split]]

    def make_env(self, example: dict[str, Any]) -> MessageEnv:
        return {env_class}(example["question"])

    def build_rubric(self) -> Rubric:
        # shows_work has weight 0: it is logged as a reward component but does not change the total.
        return Rubric([RewardFn(exact_match, weight=1.0), RewardFn(shows_work, weight=0.0)], truncation_reward=None, error_reward=0.0)
'''

_CONFIG = """# rlmesh train --config {name}/config.toml   (run from the folder that contains {name}/)
[model]
path = "smollm2-135m-instruct"

[trainer]
lr = 2e-5   # the default 1e-6 is a rate for 1B+ models; SmolLM2-135M learns at 2e-5 (dtype "auto": fp32 trainer and sampler)

[algorithm]
group_size = 8

[[tasks]]
name = "{name}.task:{task_class}"
args = {{ num_train = 200, num_validation = 20 }}
env = {{ max_new_tokens = 32, max_total_tokens = 256, max_prompt_tokens = 128, max_turns = 1 }}

[run]
name = "{name}"
steps = 10
groups_per_step = 4
eval_every = 5
"""

_TEST = '''"""{title}: hand-checked rewards, and rollouts of the tiny random Qwen3 through the real loop pieces."""

import pytest

from rollouts.types import Rollout, RolloutStatus, RolloutTurn
from tasks.testing import run_task
from {name}.task import {task_class}


def reply(text):
    turn = RolloutTurn(prompt_messages=[], prompt_token_ids=[], assistant_message={{"role": "assistant", "content": text}})
    return Rollout(rollout_id="r/0", group_id="r", task_name="{name}", sample_index=0, turns=[turn], status=RolloutStatus.COMPLETED)


@pytest.mark.asyncio
@pytest.mark.parametrize("text, expected", [("42", 1.0), (" 42 ", 1.0), ("41", 0.0), ("It is 42", 0.0)])
async def test_rubric(text, expected):
    task = {task_class}()
    task.rubric = task.build_rubric()
    [reward] = await task.score_group([reply(text)], {{"question": "q", "answer": "42"}})
    assert reward.total == expected


def test_splits_are_disjoint():
    task = {task_class}()
    train, validation = task.load_dataset("train"), task.load_dataset("validation")
    assert len(train) == 200 and len(validation) == 20
    assert not {{row["question"] for row in train}} & {{row["question"] for row in validation}}


@pytest.mark.asyncio
async def test_runs_on_the_tiny_model():
    task = {task_class}()
    groups = await run_task(task, task.load_dataset("validation")[:2], group_size=2)
    for group in groups:
        for rollout in group.rollouts:
            assert rollout.status in (RolloutStatus.COMPLETED, RolloutStatus.TRUNCATED), rollout.error
            assert rollout.turns and 0.0 <= rollout.reward <= 1.0
'''


def write_task_package(name: str, directory: Path) -> Path:
    """Write `directory/name/` (task, config, test); refuses names that are not identifiers and existing folders."""
    if not name.isidentifier() or keyword.iskeyword(name) or not name.islower():
        raise ValueError(f"task name {name!r} must be a lower-case Python identifier, e.g. my_task")
    package = directory / name
    if package.exists():
        raise ValueError(f"{package} already exists")
    camel = "".join(part.capitalize() for part in name.split("_"))
    fields = {
        "name": name,
        "title": name.replace("_", " ").capitalize(),
        "task_class": f"{camel}Task",
        "env_class": f"{camel}Env",
    }
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "task.py").write_text(_TASK.format(**fields))
    (package / "config.toml").write_text(_CONFIG.format(**fields))
    (package / "test_task.py").write_text(_TEST.format(**fields))
    return package
