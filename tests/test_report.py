"""`rlmesh report` on a run directory written here: plots, page, and a run that is still writing."""

import json
import math

import matplotlib.image

from rl.cli import main


def fake_run(run_dir, steps=12, partial_last_line=True):
    """metrics.jsonl, samples.jsonl and config.toml shaped like a real run's (two tasks)."""
    run_dir.mkdir()
    (run_dir / "config.toml").write_text('[run]\nname = "fake"\nsteps = 12\n')
    lines = [json.dumps({"step": 0, "policy_version": 0, "eval/reward/mean": 0.6})]
    for step in range(1, steps + 1):
        record = {
            "step": step, "policy_version": step, "reward/mean": 0.3 + 0.04 * step, "reward/a/mean": 0.2 + 0.05 * step,
            "reward/b/mean": 0.4 + 0.03 * step, "loss": 0.1 * math.sin(step), "train/pg_loss": 0.05 * math.cos(step),
            "train/grad_norm": 1.0 / step, "train/mismatch_k3": 0.002 * step, "train/clip_frac_low": 0.01 * step,
            "train/clip_frac_high": 0.005 * step, "rollouts/completion_tokens_mean": 20 - step,
            "rollouts/completion_tokens_max": 32, "rollouts/entropy": 2.0 - 0.1 * step, "rollouts/truncation_rate": 0.5 / step, "rollouts/policy_lag_max": step % 2,
            "rollouts/policy_lag_mean": (step % 2) / 2, "perf/sample_wait_time": 5.0, "time/train_s": 20.0,
            "time/weight_sync_s": 4.5, "time/step_s": 30.0 + (8.0 if step % 6 == 0 else 0.0),
        }
        if step % 6 == 0:
            record["eval/reward/mean"] = 0.6 + 0.02 * step
        lines.append(json.dumps(record))
    text = "\n".join(lines) + "\n" + ('{"step": 13, "reward/me' if partial_last_line else "")
    (run_dir / "metrics.jsonl").write_text(text)
    samples = [
        {"step": step, "key": "reward/samples", "episode_id": step * 10 + i, "reward": reward, "advantage": reward - 0.5,
         "target": "11", "prompt": f"user: sum the digits of {step}{i}", "response": f"reply {step}-{i}", "status": "completed",
         "response_len": 4}
        for step in range(1, steps + 1) for i, reward in enumerate((0.0, 1.0))
    ]
    (run_dir / "samples.jsonl").write_text("".join(json.dumps(sample) + "\n" for sample in samples))
    return run_dir


def test_report_writes_plots_and_a_page_for_a_run_still_writing(tmp_path, capsys):
    run_dir = fake_run(tmp_path / "run")
    assert main(["report", str(run_dir)]) == 0
    out = run_dir / "report"
    assert capsys.readouterr().out.strip() == str(out / "index.html")
    expected = ["reward.png", "response_length.png", "truncation.png", "entropy.png", "kl_clip.png", "loss.png", "policy_lag.png", "time_per_phase.png"]
    for name in expected:
        height, width, _ = matplotlib.image.imread(out / name).shape
        assert width > 500 and height > 300, name
    page = (out / "index.html").read_text()
    assert all(f'src="{name}"' in page for name in expected)
    assert "12 logged steps" not in page and "13 logged steps (last: step 12)" in page  # the half-written line is skipped
    best, worst = page.split("Worst samples")
    assert "reply 12-1" in best and "reply 10-1" in best and "reply 9-1" not in best  # only the last 3 steps
    assert "reply 12-0" in worst and "[run]" in page


def test_report_on_a_directory_without_metrics_fails_cleanly(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "metrics.jsonl is missing or empty" in capsys.readouterr().err
