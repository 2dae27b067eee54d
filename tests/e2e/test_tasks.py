"""The shipped tasks mixed in one real run (Monarch actors, vLLM, torchstore, tiny Qwen3): a single-turn, a multi-turn,
a tool-calling and a judge-graded task, a black-box agent (an OpenAI client, two chat turns, its own reward) and a
verifiers environment (its own `@vf.reward`) train together for 2 steps. The agent's and the environment's calls go
through the gateway and are captured token-exact with logprobs; the sampler matches the trainer."""

import asyncio
import json
import re
from pathlib import Path

from env_types.renderer import load_tokenizer
from rl.checkpoint import store
from rl.checkpoint.estimate import checkpoint_bytes, model_size
from rl.config import load_config
from rl.loop.controller import Controller
from tests.support.paths import E2E_CONFIGS

DEADLINE_S = 600  # a hung vLLM or store fails the test instead of holding CI
TASKS = {"reverse_text", "calculator_tool", "arithmetic_retry", "sum_digits", "agent", "verifiers"}


def assert_agent_rollout(rollout: dict) -> None:
    """Both chat turns of `tests.support.agents:two_turn_agent` (its malformed request made none), the second
    extending the first's sample, and the agent's own reward."""
    first, second = rollout["turns"]
    for turn in (first, second):
        assert len(turn["completion_logprobs"]) == len(turn["completion_token_ids"]) > 0
        assert all(logprob <= 0 for logprob in turn["completion_logprobs"])
    sampled = first["prompt_token_ids"] + first["completion_token_ids"]
    assert second["prompt_token_ids"][: len(sampled)] == sampled  # one sample: the second call extends the first
    assert second["prompt_messages"][-1] == {"role": "user", "content": "Check it and answer again."}
    assert rollout["reward"] == 1.0 / (1 + len(second["completion_token_ids"]))


def assert_verifiers_rollout(rollout: dict, tokenizer) -> None:
    """The quiz's one call, its reward the environment's (recomputed from the reply: its last integer is the sum)."""
    [turn] = rollout["turns"]
    assert len(turn["completion_logprobs"]) == len(turn["completion_token_ids"]) > 0
    a, b = map(int, re.findall(r"\d+", turn["prompt_messages"][-1]["content"]))
    numbers = re.findall(r"-?\d+", tokenizer.decode(turn["completion_token_ids"], skip_special_tokens=True))
    assert rollout["reward"] == float(bool(numbers) and int(numbers[-1]) == a + b)


async def test_mixed_tasks_train_for_two_steps(tmp_path):
    config = load_config(
        E2E_CONFIGS / "tiny_qwen3_tasks_e2e.toml",
        {"run.output_dir": str(tmp_path), "checkpoint.final": "weights"},  # the run ends with the model alone
    )
    controller = Controller(config)
    summary = await asyncio.wait_for(controller.run(), DEADLINE_S)
    run_dir = Path(summary["run_dir"])
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2] and [r["policy_version"] for r in records] == [0, 1, 2]
    rollouts = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    train = [r["rollout"] for r in rollouts if r["kind"] == "train"]
    assert len(train) == 2 * 4 * 4
    assert {r["task_name"] for r in train} == TASKS  # the run's seed draws rows of every task
    assert {r["rollout"]["task_name"] for r in rollouts if r["kind"] == "eval"} == TASKS
    for rollout in train:
        assert rollout["status"] != "error", rollout["error"]
        assert rollout["reward"] is not None
    judged = [r for r in rollouts if r["rollout"]["task_name"] == "sum_digits"]
    # graded by the frozen judge
    assert judged and all(set(r["rollout"]["reward_components"]) == {"judge"} for r in judged)
    calculator = [r for r in train if r["task_name"] == "calculator_tool"]
    # the calculator's tool spec is rendered into the system prompt: ~200 tokens before the question
    assert calculator and all(len(r["turns"][0]["prompt_token_ids"]) > 150 for r in calculator)
    tokenizer = load_tokenizer("tiny-qwen3")
    through_the_gateway = [r["rollout"] for r in rollouts if r["rollout"]["task_name"] in ("agent", "verifiers")]
    for rollout in through_the_gateway:
        assert rollout["status"] in ("completed", "truncated"), rollout["error"]
        if rollout["task_name"] == "agent":
            assert_agent_rollout(rollout)
        else:
            assert_verifiers_rollout(rollout, tokenizer)
    assert {turn["policy_version"] for r in train for turn in r["turns"]} <= {0, 1}
    for record in records[1:]:
        assert record["rollouts/gateway_new_samples"] == 0  # every gateway call was one of the rollout's turns
        assert record["train/num_loss_tokens"] > 0 and record["train/mismatch_k3"] < 1e-6
    [final] = store.committed_checkpoints(run_dir)  # checkpoint.final = "weights": model only, not resumable
    assert final.name == "step_00000002" and store.is_weights_only(final) and store.damage(final) is None
    written = sum(file.stat().st_size for file in (final / "trainer").glob("*.distcp"))
    estimate = checkpoint_bytes(model_size("tiny-qwen3"), "float32", "weights")
    assert estimate <= written <= estimate * 1.01 + 64 * 1024  # no optimizer state
