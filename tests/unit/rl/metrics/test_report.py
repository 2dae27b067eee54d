"""`rlmesh report` on a real run's files: plots, page, and a run that is still writing."""

import shutil

import matplotlib.image

from rl.commands.cli import main
from rl.metrics.report import KL_FLOOR, KL_KEYS, PHASES, best_and_worst, drawn_lines, read_jsonl
from tests.support.paths import REPO

FIXTURE = REPO / "tests" / "support" / "fixtures" / "main_job_run"
"""metrics.jsonl, samples.jsonl and config.toml of a real run of the main job (configs/sum_digits_smollm2_cpu.toml,
14 steps, 2026-11-24), so the report is tested on the keys the loop emits, not on keys a fixture invents."""


def real_run(run_dir, partial_last_line=True):
    """The main job's run files, with a half-written last line as a run still writing has."""
    run_dir.mkdir()
    for name in ("metrics.jsonl", "samples.jsonl", "config.toml"):
        shutil.copy(FIXTURE / name, run_dir / name)
    if partial_last_line:
        with open(run_dir / "metrics.jsonl", "a") as metrics:
            metrics.write('{"step": 15, "reward/me')
    return run_dir


def test_every_phase_the_report_stacks_is_a_key_the_loop_emits():
    records = read_jsonl(FIXTURE / "metrics.jsonl")
    steps = [record for record in records if "time/step_s" in record]
    assert len(steps) == 14
    for key in PHASES:  # a renamed key would read as 0 and land in "eval + other"
        assert all(key in record for record in steps), key
    assert sum(record["perf/sample_wait_time"] for record in steps) > 0


def test_report_writes_plots_and_a_page_for_a_run_still_writing(tmp_path, capsys):
    run_dir = real_run(tmp_path / "run")
    assert main(["report", str(run_dir)]) == 0
    out = run_dir / "report"
    assert capsys.readouterr().out.strip() == str(out / "index.html")
    expected = [
        "reward.png",
        "response_length.png",
        "truncation.png",
        "entropy.png",
        "kl.png",
        "clip.png",
        "loss.png",
        "grad_norm.png",
        "policy_lag.png",
        "time_per_phase.png",
    ]
    for name in expected:
        height, width, _ = matplotlib.image.imread(out / name).shape
        assert width > 500 and height > 300, name
    page = (out / "index.html").read_text()
    assert all(f'src="{name}"' in page for name in expected)
    # the half-written line is skipped
    assert "16 logged steps" not in page and "15 logged steps (last: step 14)" in page
    best, worst = page.split("Worst samples")
    # the last 3 steps' logged samples (steps 12-14), 5 of them: the 3 best (reward 1) and the 2 worst (reward 0)
    assert "Best samples of the last 3 steps (3)" in best and "of the last 3 steps (2)" in worst
    assert "4 + 8 = 12" in best and "Three is a multiple of ten" in worst and "[model]" in page
    assert "4 + 8 = 12" not in worst and "Three is a multiple of ten" not in best


def test_the_kl_panel_draws_rounding_noise_at_the_float32_floor_and_says_so():
    """The main job's `train/mismatch_k3` is negative at every step (-6e-10 at step 1: exp(-d) + d - 1 rounded in
    float32, never negative in exact arithmetic); it is drawn at 2^-24 on a log axis, the other KLs as they are."""
    records = read_jsonl(FIXTURE / "metrics.jsonl")
    assert all(record["train/mismatch_k3"] < 0 for record in records if "train/mismatch_k3" in record)
    lines, clamped = drawn_lines(records, KL_KEYS, KL_FLOOR)
    drawn = {label: values for label, _, values in lines}
    assert clamped and KL_FLOOR == 5.960464477539063e-08 and set(drawn) == {"train/mismatch_k3", "train/ppo_kl"}
    assert drawn["train/mismatch_k3"] == [KL_FLOOR] * 14
    assert drawn["train/ppo_kl"][0] == 6.54064056869311e-06  # step 1's, above the floor: unchanged


def test_the_loss_is_drawn_and_a_term_equal_to_it_is_named_in_its_label():
    records = read_jsonl(FIXTURE / "metrics.jsonl")
    lines, _ = drawn_lines(records, ["loss", "train/pg_loss", "train/ce_loss"])
    [(label, steps, values)] = lines  # pg_loss is the only term: one line, not two on top of each other
    assert label == "loss (= train/pg_loss)" and steps == list(range(1, 15)) and values[0] == 0.012644250877201557
    records[3]["train/pg_loss"] += 0.5  # a term that differs gets its own line
    assert [label for label, _, _ in drawn_lines(records, ["loss", "train/pg_loss"])[0]] == ["loss", "train/pg_loss"]


def test_best_and_worst_samples_never_share_a_sample():
    samples = [{"reward": reward, "id": index} for index, reward in enumerate([0.5, 1.0, 0.0, 0.25, 0.75])]
    best, worst = best_and_worst(samples, per_side=5)
    assert [s["reward"] for s in best] == [1.0, 0.75, 0.5] and [s["reward"] for s in worst] == [0.0, 0.25]
    many = [{"reward": index / 20} for index in range(20)]
    best, worst = best_and_worst(many, per_side=5)
    assert [s["reward"] for s in best] == [0.95, 0.9, 0.85, 0.8, 0.75] and [s["reward"] for s in worst][:2] == [0, 0.05]
    assert best_and_worst([{"reward": 1.0}], per_side=5) == ([{"reward": 1.0}], [])


def test_several_runs_are_compared_on_one_page(tmp_path, capsys):
    """Two runs of the main job differing in trainer.lr and the generator's seed: a line per run, a summary row per run
    and the config keys on which they differ (the two, nothing else)."""
    first = real_run(tmp_path / "lr_a", partial_last_line=False)
    second = real_run(tmp_path / "lr_b", partial_last_line=False)
    config = (second / "config.toml").read_text()
    assert "lr = 2e-05" in config and "max_model_len = 256\nseed = 0" in config
    config = config.replace("lr = 2e-05", "lr = 1e-05").replace(
        "max_model_len = 256\nseed = 0", "max_model_len = 256\nseed = 1"
    )
    (second / "config.toml").write_text(config)
    lines = (second / "metrics.jsonl").read_text().splitlines()[:5]  # a shorter run: steps 0-4
    (second / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    assert main(["report", str(first), str(second), "--out", str(tmp_path / "both")]) == 0
    page_path = tmp_path / "both" / "index.html"
    assert capsys.readouterr().out.strip() == str(page_path)
    page = page_path.read_text()
    assert "2 runs compared" in page and "Config keys that differ (2)" in page
    assert "<td>trainer.lr</td><td>2e-05</td><td>1e-05</td>" in page
    assert "<td>generator.seed</td><td>0</td><td>1</td>" in page
    assert f"<td>{first}</td><td>14</td>" in page and f"<td>{second}</td><td>4</td>" in page
    for name in ("reward_mean.png", "eval_reward_mean.png", "loss.png", "train_mismatch_k3.png", "time_step_s.png"):
        height, width, _ = matplotlib.image.imread(tmp_path / "both" / name).shape
        assert width > 500 and height > 300, name
    assert main(["report", str(first), str(second)]) == 0  # default: beside the first run
    assert (tmp_path / "report-compare" / "index.html").is_file()


def test_report_arguments_that_make_no_sense_are_refused(tmp_path, capsys):
    run_dir = real_run(tmp_path / "run", partial_last_line=False)
    assert main(["report", str(run_dir), str(run_dir)]) == 2
    assert "is given twice" in capsys.readouterr().err
    assert main(["report", str(run_dir), "--out", str(tmp_path / "x")]) == 2
    assert "--out is for comparing several runs" in capsys.readouterr().err
    assert main(["report", str(run_dir), str(tmp_path / "missing")]) == 2
    assert "missing/metrics.jsonl is missing or empty" in capsys.readouterr().err


def test_report_on_a_directory_without_metrics_fails_cleanly(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "metrics.jsonl is missing or empty" in capsys.readouterr().err
