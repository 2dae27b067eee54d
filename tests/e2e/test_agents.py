"""A black-box agent (an OpenAI client, two chat turns, its own reward) trains through `tasks.agent:AgentTask` in a real
run (Monarch actors, vLLM, torchstore, tiny Qwen3): every call is captured token-exact with logprobs and the sampler
matches the trainer."""

import re
from pathlib import Path

from transformers import AutoTokenizer

from rl.assets import resolve_model_path
from rl.config import load_config
from rl.loop.controller import Controller
from tests.support.paths import TINY
from tests.support.runs import read_jsonl

AGENT_TASK = {
    "tasks.0.name": "agent",
    "tasks.0.args": '{ agent = "tests.support.agents:two_turn_agent", rows = "tests.support.agents:sum_rows" }',
    "tasks.0.env.max_turns": "2",
}


async def test_a_two_turn_agent_trains_token_exact(tmp_path):
    config = load_config(TINY, {"run.output_dir": str(tmp_path), **AGENT_TASK})
    summary = await Controller(config).run()
    run_dir = Path(summary["run_dir"])
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2] and records[-1]["policy_version"] == 2
    rollouts = read_jsonl(run_dir / "rollouts.jsonl")
    train = [r["rollout"] for r in rollouts if r["kind"] == "train"]
    assert len(train) == 2 * 2 * 4 and any(r["kind"] == "eval" for r in rollouts)
    for rollout in [r["rollout"] for r in rollouts]:
        assert rollout["status"] in ("completed", "truncated"), rollout["error"]
        first, second = rollout["turns"]  # both chat turns; the malformed request made none
        for turn in (first, second):
            assert len(turn["completion_logprobs"]) == len(turn["completion_token_ids"]) > 0
            assert all(logprob <= 0 for logprob in turn["completion_logprobs"])
        sampled = first["prompt_token_ids"] + first["completion_token_ids"]
        assert second["prompt_token_ids"][: len(sampled)] == sampled  # one sample: the second call extends the first
        assert second["prompt_messages"][-1] == {"role": "user", "content": "Check it and answer again."}
        assert rollout["reward"] == 1.0 / (1 + len(second["completion_token_ids"]))  # the agent's own reward
    for record in records[1:]:
        assert record["rollouts/gateway_new_samples"] == 0
        assert record["train/num_loss_tokens"] > 0 and record["train/mismatch_k3"] < 1e-6
    assert [r["policy_version"] for r in records] == [0, 1, 2]
    trained_versions = {turn["policy_version"] for r in train for turn in r["turns"]}
    assert trained_versions <= {0, 1}


VERIFIERS_TASK = {
    "tasks.0.name": "verifiers",
    "tasks.0.args": '{ taskset = "tests.support.verifiers_quiz", num_validation = 2 }',
    "tasks.0.env.max_turns": "1",
}


async def test_a_verifiers_environment_trains_through_the_gateway(tmp_path):
    """A local verifiers taskset (its own `@vf.reward`) trains two steps: each episode's one call is a token-exact
    turn, its reward the environment's (recomputed here from the reply: its last integer is the sum)."""
    config = load_config(TINY, {"run.output_dir": str(tmp_path), **VERIFIERS_TASK})
    summary = await Controller(config).run()
    run_dir = Path(summary["run_dir"])
    records = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2] and records[-1]["policy_version"] == 2
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("tiny-qwen3"))
    rollouts = read_jsonl(run_dir / "rollouts.jsonl")
    assert len([r for r in rollouts if r["kind"] == "train"]) == 2 * 2 * 4
    for record in rollouts:
        rollout = record["rollout"]
        assert rollout["status"] in ("completed", "truncated"), rollout["error"]
        [turn] = rollout["turns"]
        assert len(turn["completion_logprobs"]) == len(turn["completion_token_ids"]) > 0
        a, b = map(int, re.findall(r"\d+", turn["prompt_messages"][-1]["content"]))
        numbers = re.findall(r"-?\d+", tokenizer.decode(turn["completion_token_ids"], skip_special_tokens=True))
        assert rollout["reward"] == float(bool(numbers) and int(numbers[-1]) == a + b)
    for record in records[1:]:
        assert record["train/num_loss_tokens"] > 0 and record["train/mismatch_k3"] < 1e-6
