"""Four tasks on different algorithms in one run, correction preset on: grpo, opd from a frozen teacher,
opsd, and sft on rollouts the frozen teacher samples.

Real Monarch actors, vLLM (policy and a frozen teacher), torchstore and the tiny Qwen3 (fp32), 2 steps.
"""

import asyncio
import json
import math
from pathlib import Path

import pytest
import pytest_asyncio

from rl.config import load_config
from rl.loop.controller import Controller
from tests.support.paths import E2E_CONFIGS

pytestmark = [pytest.mark.asyncio(loop_scope="module")]
DEADLINE_S = 600  # a hung vLLM or store fails the test instead of holding CI


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def run(tmp_path_factory):
    config = load_config(
        E2E_CONFIGS / "tiny_qwen3_algorithms_e2e.toml", {"run.output_dir": str(tmp_path_factory.mktemp("runs"))}
    )
    controller = Controller(config)
    await asyncio.wait_for(controller.setup(), DEADLINE_S)
    probe = controller.renderers["sum_digits"].render_ids(
        [{"role": "user", "content": "Sum the digits of 47."}, {"role": "assistant", "content": "11"}]
    )
    [teacher] = controller.roles.frozen_actors["teacher"]
    teacher_before = await teacher.prompt_logprobs.call_one(probe)
    try:
        summary = await asyncio.wait_for(controller.train(), DEADLINE_S)
        teacher_after = await teacher.prompt_logprobs.call_one(probe)
        policy_after = await controller.roles.trainer.logprobs.call_one(probe)
        teacher_version = await teacher.version.call_one()
    finally:
        await controller.shutdown()
    run_dir = Path(summary["run_dir"])
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rollouts = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    yield dict(
        records=records,
        rollouts=rollouts,
        teacher_before=teacher_before,
        teacher_after=teacher_after,
        policy_after=policy_after,
        teacher_version=teacher_version,
    )


async def test_every_algorithm_trains_in_each_step(run):
    records = run["records"]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert record["train/num_loss_tokens"] > 0  # grpo tokens (rl component)
        assert record["train/num_ref_kl_tokens"] > 0  # opd and opsd tokens (ref_kl component)
        assert record["train/num_ce_tokens"] > 0  # sft on the teacher's samples (ce component)
        for key in ("train/pg_loss", "train/ref_kl_loss", "train/ce_loss", "ref_kl/kl", "train/entropy"):
            assert math.isfinite(record[key]), key
        for task in ("sum_digits", "SumDigitsTask", "SelfDistilledDigits"):  # an import path is named by its class
            assert f"advantage/{task}/mean" in record, task


async def test_frozen_sampled_rollouts_are_tagged_and_never_stale(run):
    by_task = {}
    for record in run["rollouts"]:
        by_task.setdefault(record["rollout"]["task_name"], []).append(record["rollout"])
    sampled = by_task["TeacherSampledDigits"]
    assert sampled and all(r["metadata"]["sampler"] == "teacher" for r in sampled)
    assert all(turn["policy_version"] == 0 for r in sampled for turn in r["turns"])  # the teacher never changes
    assert all("sampler" not in r["metadata"] for r in by_task["sum_digits"])
    assert all(record["rollouts/evicted_stale_groups"] == 0 for record in run["records"])


async def test_correction_preset_logs_its_diagnostics(run):
    for record in run["records"]:
        for key in (
            "rollout_corr/rollout_is_mean",
            "rollout_corr/rollout_is_eff_sample_size",
            "rollout_corr/k3_kl",
            "rollout_corr/chi2_token",
            "rollout_corr/log_ppl_abs_diff",
            "rollout_corr/rollout_is_seq_max",
        ):
            assert math.isfinite(record[key]), key
        # fp32 sampler and fp32 trainer on the same weights: π_old / π_rollout ≈ 1
        assert abs(record["rollout_corr/rollout_is_mean"] - 1) < 1e-3


async def test_the_frozen_teacher_is_never_updated(run):
    assert run["teacher_version"] == 0
    assert run["teacher_after"] == run["teacher_before"]
    assert max(abs(a - b) for a, b in zip(run["teacher_after"], run["policy_after"])) > 1e-3


async def test_sft_from_the_dataset_generates_nothing_and_echo_trains(run):
    by_task = {}
    for record in run["rollouts"]:
        by_task.setdefault(record["rollout"]["task_name"], []).append(record["rollout"])
    demos = by_task["DemonstratedDigits"]
    assert demos and all(r["metadata"]["sampler"] == "dataset" and len(r["turns"]) == 1 for r in demos)
    assert len({r["group_id"] for r in demos}) == len(demos)  # one demonstration per row, not group_size generations
    # the random tiny model rarely stops within 8 tokens: its retries are unit-tested
    echo = by_task["arithmetic_retry"]
    assert any(r["advantage"] is not None for r in echo)  # rollouts.jsonl carries the advantage the step trained
