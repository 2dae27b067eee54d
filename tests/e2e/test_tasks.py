"""The shipped tasks mixed in one real run (Monarch actors, vLLM, torchstore, tiny Qwen3): a
single-turn, a multi-turn, a tool-calling and a judge-graded task train together for 2 steps."""

import asyncio
import json
from pathlib import Path

from rl.checkpoint import store
from rl.checkpoint.estimate import checkpoint_bytes, model_size
from rl.config import load_config
from rl.loop.controller import Controller
from tests.support.paths import E2E_CONFIGS

DEADLINE_S = 600  # a hung vLLM or store fails the test instead of holding CI


async def test_mixed_tasks_train_for_two_steps(tmp_path):
    config = load_config(
        E2E_CONFIGS / "tiny_qwen3_tasks_e2e.toml",
        {"run.output_dir": str(tmp_path), "checkpoint.final": "weights"},  # the run ends with the model alone
    )
    controller = Controller(config)
    summary = await asyncio.wait_for(controller.run(), DEADLINE_S)
    run_dir = Path(summary["run_dir"])
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2] and records[-1]["policy_version"] == 2
    rollouts = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    train = [r["rollout"] for r in rollouts if r["kind"] == "train"]
    assert len(train) == 2 * 4 * 4
    assert {r["rollout"]["task_name"] for r in rollouts} == {
        "reverse_text",
        "calculator_tool",
        "arithmetic_retry",
        "sum_digits",
    }
    for rollout in train:
        assert rollout["status"] != "error", rollout["error"]
        assert rollout["reward"] is not None
    judged = [r for r in rollouts if r["rollout"]["task_name"] == "sum_digits"]
    assert judged and all(
        set(r["rollout"]["reward_components"]) == {"judge"} for r in judged
    )  # graded by the frozen judge
    calculator = [r for r in train if r["task_name"] == "calculator_tool"]
    # the calculator's tool spec is rendered into the system prompt: ~200 tokens before the question
    assert calculator and all(len(r["turns"][0]["prompt_token_ids"]) > 150 for r in calculator)
    assert any(r["train/num_loss_tokens"] > 0 for r in records[1:] if "train/num_loss_tokens" in r)
    [final] = store.committed_checkpoints(run_dir)  # checkpoint.final = "weights": model only, not resumable
    assert final.name == "step_00000002" and store.is_weights_only(final) and store.damage(final) is None
    written = sum(file.stat().st_size for file in (final / "trainer").glob("*.distcp"))
    estimate = checkpoint_bytes(model_size("tiny-qwen3"), "float32", "weights")
    assert estimate <= written <= estimate * 1.01 + 64 * 1024  # no optimizer state
