"""`rlmesh report` on a real run's files: plots, page, and a run that is still writing."""

import shutil

import matplotlib.image

from rl.cli import main
from rl.metrics.report import PHASES, read_jsonl
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
        "kl_clip.png",
        "loss.png",
        "policy_lag.png",
        "time_per_phase.png",
    ]
    for name in expected:
        height, width, _ = matplotlib.image.imread(out / name).shape
        assert width > 500 and height > 300, name
    page = (out / "index.html").read_text()
    assert all(f'src="{name}"' in page for name in expected)
    assert (
        "16 logged steps" not in page and "15 logged steps (last: step 14)" in page
    )  # the half-written line is skipped
    best, worst = page.split("Worst samples")
    # the last 3 steps' logged samples (steps 12-14): best 4 + 8 = 12 (step 14), worst the step-12 reply
    assert "4 + 8 = 12" in best and "Three is a multiple of ten" in worst and "[model]" in page


def test_report_on_a_directory_without_metrics_fails_cleanly(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "metrics.jsonl is missing or empty" in capsys.readouterr().err
