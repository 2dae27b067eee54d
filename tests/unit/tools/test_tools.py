"""Tool calls through the real Qwen3 renderer: malformed calls answered and recorded, misbehaving
tools stopped by the sandbox and reported to the model, and trained tokens equal to sampled tokens
across a multi-turn tool conversation."""

import os
import socket
from pathlib import Path

import pytest

from env_types.message_env import ResetOutput, StepOutput
from rl.algorithms.samples import rollout_to_samples
from rl.config.tasks import RendererEnvConfig
from rollouts.types import Completion, RolloutStatus
from tasks.sum_digits import SumDigitsTask
from tasks.testing import play
from tools.sandbox import Sandbox, SandboxError, SandboxLimits
from tools.tool import Tool, ToolEnv

pytestmark = pytest.mark.processes  # tools run in sandboxed subprocesses

IM_END = 151645
LIMITS = SandboxLimits(timeout_s=120.0, cpu_s=2, memory_mb=256)
"""Wall-clock timeout far above what a loaded machine needs to start a tool: only CPU and memory limits stop these."""


def tool(tool_name, fn, **properties):
    return Tool(
        name=tool_name,
        description=f"{tool_name} tool",
        fn=f"tests.support.sandbox_tools:{fn}",
        parameters={"type": "object", "properties": properties, "required": list(properties)},
    )


TOOLS = [
    tool("add", "add", a={"type": "integer"}, b={"type": "integer"}),
    tool("loop", "loop_forever"),
    tool("allocate", "allocate", megabytes={"type": "integer"}),
    tool("connect", "open_socket", host={"type": "string"}, port={"type": "integer"}),
    tool("write", "write_file", path={"type": "string"}),
    tool("read", "read_scratch", name={"type": "string"}),
]


class ToolsEnv(ToolEnv):
    async def reset(self):
        return ResetOutput(messages=[{"role": "user", "content": "Use the tools."}], tools=self.tool_specs())

    async def answer(self, assistant_message):
        return StepOutput(done=True, reward=1.0)


class ToolsTask(SumDigitsTask):
    def make_env(self, example):
        return ToolsEnv(TOOLS, limits=LIMITS)


def call(tool_name, **arguments):
    import json

    return f"<tool_call>\n{json.dumps({'name': tool_name, 'arguments': arguments})}\n</tool_call>"


def scripted(tokenizer, replies):
    """Each turn samples the next reply; logprobs are distinct per token so misalignment would show."""
    queue = list(replies)
    counter = iter(range(10_000))

    async def generate(requests):
        results = []
        for _ in requests:
            ids = [*tokenizer.encode(queue.pop(0), add_special_tokens=False), IM_END]
            results.append(
                Completion(
                    token_ids=ids, logprobs=[-0.01 * next(counter) for _ in ids], finish_reason="stop", policy_version=3
                )
            )
        return results

    return generate


async def run(renderer, tokenizer, replies, max_turns=8):
    env_config = RendererEnvConfig(max_turns=max_turns, max_total_tokens=4096, max_prompt_tokens=4000, env_timeout_s=30)
    return await play(ToolsTask(), {}, renderer, env_config, scripted(tokenizer, replies))


def tool_replies(rollout):
    return [message["content"] for turn in rollout.turns for message in turn.env_messages]


async def test_malformed_calls_become_tool_messages_recorded_on_the_turn(renderer, tokenizer):
    rollout = await run(
        renderer,
        tokenizer,
        [
            '<tool_call>\n{"name": "add", "arguments": {"a": 1,}\n</tool_call>',  # bad JSON
            call("multiply", a=2, b=3),  # unknown tool
            call("add", a=2),  # missing argument
            call("add", a="2", b=3),  # wrong type
            call("add", a=2, b=3, c=4),  # unknown argument
            call("add", a=2, b=3),  # fine
            "Done: 5",
        ],
    )
    assert rollout.status is RolloutStatus.COMPLETED and len(rollout.turns) == 7
    replies = tool_replies(rollout)
    assert replies[0].startswith("Error: your tool call could not be parsed (invalid_json)")
    assert replies[1] == "Error: unknown tool 'multiply'; available tools: add, allocate, connect, loop, read, write."
    assert replies[2] == "Error: bad arguments for 'add': missing required argument(s) 'b'."
    assert replies[3] == "Error: bad arguments for 'add': argument 'a' must be of type integer, got \"2\"."
    assert replies[4] == "Error: bad arguments for 'add': unknown argument(s) 'c'; expected ['a', 'b']."
    assert replies[5] == "5"
    kinds = [[error.kind for error in turn.tool_call_errors] for turn in rollout.turns]
    assert kinds == [
        ["invalid_json"],
        ["unknown_tool"],
        ["bad_arguments"],
        ["bad_arguments"],
        ["bad_arguments"],
        [],
        [],
    ]
    assert rollout.num_malformed_tool_calls == 5
    assert rollout.turns[0].assistant_message["invalid_tool_calls"][0]["error"] == "invalid_json"
    assert [turn.reward for turn in rollout.turns] == [None] * 6 + [1.0]
    assert rollout.turns[1].env_messages[0] == {"role": "tool", "content": replies[1], "name": "multiply"}


async def test_misbehaving_tools_are_stopped_and_reported_to_the_model(renderer, tokenizer):
    outside = Path(__file__).parent / "escape.txt"  # in the sandbox's tree, read-only
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    try:
        rollout = await run(
            renderer,
            tokenizer,
            [
                call("loop"),
                call("allocate", megabytes=2000),
                call("connect", host="127.0.0.1", port=port),
                call("write", path=str(outside)),
                call("write", path="notes.txt"),
                call("read", name="notes.txt"),
                "ok",
            ],
        )
    finally:
        listener.close()
    replies = tool_replies(rollout)
    assert replies[0] == "Error: tool 'loop' failed: the tool was killed (CPU limit 2 s or a signal)"
    assert replies[1] == "Error: tool 'allocate' failed: the tool ran out of memory (limit reached)"
    # an empty network namespace: its loopback is down (unshare) or up with nothing listening (bwrap)
    assert replies[2].startswith(
        (
            "Error: tool 'connect' failed: OSError: [Errno 101] Network is unreachable",
            "Error: tool 'connect' failed: ConnectionRefusedError: [Errno 111] Connection refused",
        )
    )
    assert replies[3].startswith("Error: tool 'write' failed: OSError: [Errno 30] Read-only file system")
    assert not outside.exists()
    assert replies[4] == "wrote notes.txt"  # the scratch directory is writable ...
    # ... and ends with its call
    assert (
        replies[5] == "Error: tool 'read' failed: FileNotFoundError: [Errno 2] No such file or directory: 'notes.txt'"
    )
    assert [e.kind for turn in rollout.turns for e in turn.tool_call_errors] == ["tool_failed"] * 5
    assert rollout.num_malformed_tool_calls == 0 and rollout.status is RolloutStatus.COMPLETED


async def test_a_tool_that_outlives_its_wall_clock_timeout_is_stopped():
    sandbox = Sandbox(SandboxLimits(timeout_s=1.0))
    with pytest.raises(SandboxError, match="the tool took longer than 1 s and was stopped"):
        await sandbox.run("tests.support.sandbox_tools:sleep_forever", {})
    sandbox.close()


async def test_sandbox_hides_other_processes_and_cleans_up():
    sandbox = Sandbox(LIMITS)
    with pytest.raises(SandboxError, match="No such process"):
        await sandbox.run("tests.support.sandbox_tools:kill_parent", {"pid": os.getpid()})
    assert await sandbox.run("tests.support.sandbox_tools:prints", {}) == "hello from the tool\n"


async def test_tool_conversation_trains_exactly_the_sampled_tokens(renderer, tokenizer):
    rollout = await run(
        renderer,
        tokenizer,
        [
            "Let me add. " + call("add", a=19, b=23),
            '<tool_call>\n{"name": "add"\n</tool_call>',
            call("add", a=42, b=100),
            "The total is 142.",
        ],
    )
    assert rollout.status is RolloutStatus.COMPLETED and len(rollout.turns) == 4
    assert rollout.turns[0].assistant_message["tool_calls"][0]["function"] == {
        "name": "add",
        "arguments": {"a": 19, "b": 23},
    }
    [sample] = rollout_to_samples(rollout, advantage=1.0)
    # every sampled token appears once, in order, with its own sampler logprob, and is the only trained token
    trained = [token for token, mask in zip(sample.input_ids, sample.loss_mask) if mask]
    assert trained == [token for turn in rollout.turns for token in turn.completion_token_ids]
    trained_logprobs = [lp for lp, mask in zip(sample.sampling_logprobs, sample.loss_mask) if mask]
    assert trained_logprobs == [lp for turn in rollout.turns for lp in turn.completion_logprobs]
    last = rollout.turns[-1]
    assert sample.input_ids == last.prompt_token_ids + last.completion_token_ids
    text = tokenizer.decode(sample.input_ids)
    assert text.count("<tool_response>\n42\n</tool_response>") == 1 and "<tool_response>\n142\n</tool_response>" in text
    assert "could not be parsed (invalid_json)" in text
