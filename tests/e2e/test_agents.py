"""A black-box agent (an OpenAI client, two chat turns, its own reward) trains through `tasks.agent:AgentTask` in a real
run (Monarch actors, vLLM, torchstore, tiny Qwen3): every call is captured token-exact with logprobs and the sampler
matches the trainer."""

from pathlib import Path

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
