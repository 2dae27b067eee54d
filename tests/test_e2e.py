"""The whole loop with real Monarch actors, vLLM, torchstore and a tiny Qwen3 (fp32).

One controller run is shared by every test in this module: it is the expensive part.
"""

import asyncio
import json
from pathlib import Path

import psutil
import pytest
import pytest_asyncio

from rl.config import load_config
from rl.controller import Controller

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

REPO = Path(__file__).resolve().parent.parent
FIXED_COMPLETION = "The digits of 47 sum to 11."
DEADLINE_S = 600  # a hung vLLM or store fails the module instead of blocking CI


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def trained(tmp_path_factory):
    run_root = tmp_path_factory.mktemp("runs")
    config = load_config(
        REPO / "configs" / "tiny_qwen3_e2e.toml",
        {
            "run.output_dir": str(run_root),
            "tasks.0.rubric.reward_fns": "[{fn = 'tests.e2e_rewards:even_token_share'}]",
            "run.weight_sync_timeout_s": "120",
        },
    )
    controller = Controller(config)
    await asyncio.wait_for(controller.setup(), DEADLINE_S)
    renderer = controller.renderers["sum_digits"]
    probe = renderer.render_ids(
        [{"role": "user", "content": "Sum the digits of 47."}, {"role": "assistant", "content": FIXED_COMPLETION}]
    )
    before = await controller.trainer.logprobs.call_one(probe)
    try:
        summary = await asyncio.wait_for(controller.train(), DEADLINE_S)
        after_trainer = await controller.trainer.logprobs.call_one(probe)
        after_generator = await controller.generators.slice(procs=0).prompt_logprobs.call_one(probe)
        generator_version = await controller.generators.slice(procs=0).version.call_one()
        children = [p for p in psutil.Process().children(recursive=True) if "monarch" in " ".join(p.cmdline())]
    finally:
        await controller.shutdown()
    yield {
        "controller": controller,
        "summary": summary,
        "run_dir": Path(summary["run_dir"]),
        "before": before,
        "after_trainer": after_trainer,
        "after_generator": after_generator,
        "generator_version": generator_version,
        "children": children,
    }


async def test_training_changed_the_weights_and_the_generator_runs_them(trained):
    before, after_trainer, after_generator = trained["before"], trained["after_trainer"], trained["after_generator"]
    assert max(abs(a - b) for a, b in zip(before, after_trainer)) > 1e-3
    assert trained["generator_version"] == trained["controller"].state.policy_version == 2
    assert max(abs(a - b) for a, b in zip(after_trainer, after_generator)) < 1e-4


async def test_metrics_file_has_one_flat_record_per_step(trained):
    records = [json.loads(line) for line in (trained["run_dir"] / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2]
    assert [r["policy_version"] for r in records] == [0, 1, 2]
    for record in records[1:]:
        for key in ("reward/mean", "loss", "eval/reward/mean", "perf/generation_tokens_per_s", "train/train_tokens_per_s",
                    "time/generation_s", "time/train_s", "time/weight_sync_s", "rollouts/dropped_groups"):
            assert key in record, key
        assert all(not isinstance(value, (dict, list)) for value in record.values())
    assert records[1]["train/num_loss_tokens"] > 0 and records[1]["loss"] != 0.0
    # fp32 sampler = the trainer's exact weights: the sampling logprobs the loss uses match the trainer's.
    assert abs(records[1]["train/ratio_mean"] - 1) < 1e-4 and records[1]["train/mismatch_k3"] < 1e-6


async def test_step_metrics_agree_with_the_rollouts_they_summarize(trained):
    run_dir = trained["run_dir"]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rollouts = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    for record in records[1:]:
        trained_here = [r["rollout"] for r in rollouts if r["kind"] == "train" and r["step"] == record["step"]]
        assert len(trained_here) == 2 * 4
        assert record["reward/mean"] == pytest.approx(sum(r["reward"] for r in trained_here) / len(trained_here), abs=1e-9)
        assert sum(value for key, value in record.items() if key.startswith("rollouts/status/")) == len(trained_here)
        assert record["rollouts/dropped_groups"] == 0 and record["rollouts/too_long"] == 0
        completion_tokens = sum(len(turn["completion_token_ids"]) for r in trained_here for turn in r["turns"])
        assert record["train/num_loss_tokens"] == completion_tokens
        assert record["rollouts/policy_lag_max"] == 0 and record["rollouts/evicted_stale_groups"] == 0


async def test_rollouts_config_and_wandb_files_are_written(trained):
    run_dir = trained["run_dir"]
    rollouts = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    train = [r for r in rollouts if r["kind"] == "train"]
    assert len(train) == 2 * 2 * 4  # steps x groups x group size
    assert {r["rollout"]["turns"][0]["policy_version"] for r in train if r["step"] == 2} == {1}
    assert load_config(run_dir / "config.toml") == trained["controller"].config
    evals = [r for r in rollouts if r["kind"] == "eval"]
    assert len(evals) == 4 * 3 and {r["step"] for r in evals} == {0, 1, 2}  # 4 held-out rows at steps 0, 1, 2
    assert list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))


async def test_no_actor_process_outlives_the_run(trained):
    assert trained["children"], "actors should run in child processes"
    assert not [p for p in trained["children"] if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
