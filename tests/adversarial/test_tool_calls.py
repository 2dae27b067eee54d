"""Malformed tool calls and tool output are told to the model as tool errors; the rollout goes on
(each of these would otherwise end the rollout as an ERROR)."""

import pytest

from env_types.message_env import ResetOutput, StepOutput
from rl.config.tasks import RendererEnvConfig
from rollouts.types import Completion, RolloutStatus
from tasks.sum_digits import SumDigitsTask
from tasks.testing import play
from tools.tool import Tool, ToolEnv

pytestmark = pytest.mark.processes  # tools run in sandboxed subprocesses

IM_END = 151645


def tool(name: str, fn: str) -> Tool:
    return Tool(
        name=name,
        description=name,
        fn=f"tests.support.sandbox_payloads:{fn}",
        parameters={"type": "object", "properties": {}},
    )


class HostileToolsEnv(ToolEnv):
    async def reset(self):
        return ResetOutput(messages=[{"role": "user", "content": "Use the tools."}], tools=self.tool_specs())

    async def answer(self, assistant_message):
        return StepOutput(done=True, reward=1.0)


class HostileToolsTask(SumDigitsTask):
    def make_env(self, example):
        return HostileToolsEnv([tool("five", "not_an_object"), tool("surrogate", "surrogate")])


async def test_malformed_calls_and_output_become_tool_messages(renderer, tokenizer):
    replies = iter(
        [
            '<tool_call>\n{"name": ["five"], "arguments": {}}\n</tool_call>',  # a name that is not a string
            '<tool_call>\n{"name": "five", "arguments": {"n": '
            + "1" * 5000
            + "}}\n</tool_call>",  # past Python's int-parsing limit
            '<tool_call>\n{"name": "five", "arguments": {}}\n</tool_call>',  # output that is not the result
            '<tool_call>\n{"name": "surrogate", "arguments": {}}\n</tool_call>',  # a lone surrogate in the result
            "done",
        ]
    )

    async def generate(requests):
        ids = [*tokenizer.encode(next(replies), add_special_tokens=False), IM_END]
        return [Completion(token_ids=ids, logprobs=[-0.1] * len(ids), finish_reason="stop", policy_version=0)]

    config = RendererEnvConfig(max_turns=6, max_total_tokens=8192, max_prompt_tokens=8000, env_timeout_s=60)
    rollout = await play(HostileToolsTask(), {}, renderer, config, generate)
    assert rollout.status is RolloutStatus.COMPLETED, rollout.error
    messages = [message["content"] for turn in rollout.turns for message in turn.env_messages]
    assert messages[0] == 'Error: the tool name must be a string, got ["five"].'
    assert messages[1].startswith("Error: your tool call could not be parsed (invalid_json)")
    assert messages[2].startswith("Error: tool 'five' failed: the tool's output is malformed")
    assert messages[3] == "x ? y"
    kinds = [[error.kind for error in turn.tool_call_errors] for turn in rollout.turns]
    assert kinds == [["bad_arguments"], ["invalid_json"], ["tool_failed"], [], []]
