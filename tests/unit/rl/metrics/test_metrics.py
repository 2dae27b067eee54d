"""record_metric reductions across simulated processes, timers, backends and the logger's failure handling."""

import json
import math
import pickle
import time
from pathlib import Path

import pytest
import torch

from rl.config import load_config
from rl.metrics import Reduce, record_metric, timer
from rl.metrics.backends import ConsoleBackend, JsonlBackend
from rl.metrics.logger import MetricsLogger
from rl.metrics.reduce import MetricCollector, drain_states, reduce_states
from tests.support.paths import E2E_CONFIGS

PROCESS_VALUES = [[1.0, 2.0, 3.0], [10.0], [4.0, 4.0]]  # all six: sum 24, mean 4, squared deviations 9+4+1+36+0+0 = 50


def states_of(values_per_process, reduction):
    """Each process records its values in its own collector; its drained state crosses a process boundary (pickle)."""
    states = []
    for values in values_per_process:
        collector = MetricCollector()
        for value in values:
            collector.record("m", value, reduction)
        states.append(pickle.loads(pickle.dumps(collector.drain())))
    return states


@pytest.mark.parametrize(
    ("reduction", "expected"),
    [
        (Reduce.MEAN, 24 / 6),  # count-weighted; the mean of the means would be (2 + 10 + 4) / 3 = 5.33
        (Reduce.SUM, 24.0),
        (Reduce.MAX, 10.0),
        (Reduce.MIN, 1.0),
        (Reduce.STD, math.sqrt(50 / 6)),  # population std of all six values, from merged moments
    ],
)
def test_each_reduction_across_processes_equals_one_process_seeing_everything(reduction, expected):
    metrics, samples = reduce_states(states_of(PROCESS_VALUES, reduction))
    assert metrics == {"m": pytest.approx(expected, rel=1e-12)} and samples == {}


def test_std_merge_is_exact_for_uneven_and_empty_processes():
    values = [[0.5], [], [2.0, -1.0, 7.25, 3.0], [100.0, 101.0]]
    metrics, _ = reduce_states(states_of(values, Reduce.STD))
    flat = [v for vs in values for v in vs]
    mean = sum(flat) / len(flat)
    assert metrics["m"] == pytest.approx(math.sqrt(sum((v - mean) ** 2 for v in flat) / len(flat)), rel=1e-12)


def test_a_key_seen_in_only_some_processes_and_samples_concatenate_in_process_order():
    first, second = MetricCollector(), MetricCollector()
    first.record("reward/samples", {"id": 1}, Reduce.SAMPLE)
    first.record("only_first", 3, Reduce.SUM)
    second.record("reward/samples", {"id": 2}, Reduce.SAMPLE)
    second.record("reward/samples", {"id": 3}, Reduce.SAMPLE)
    metrics, samples = reduce_states([first.drain(), second.drain()])
    assert metrics == {"only_first": 3.0}
    assert samples == {"reward/samples": [{"id": 1}, {"id": 2}, {"id": 3}]}


def test_draining_resets_the_process_accumulators():
    record_metric("drained", 1.0, Reduce.SUM)
    assert "drained" in drain_states()
    assert "drained" not in drain_states()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), torch.tensor(float("nan"))])
def test_a_non_finite_value_is_rejected_at_record_time_naming_the_key(value):
    with pytest.raises(ValueError, match="'train/loss'.*not finite"):
        MetricCollector().record("train/loss", value, Reduce.MEAN)


def test_a_non_number_or_a_non_dict_sample_is_rejected_naming_the_key():
    collector = MetricCollector()
    with pytest.raises(TypeError, match="'reward/mean'.*real number, got str"):
        collector.record("reward/mean", "0.5", Reduce.MEAN)
    with pytest.raises(TypeError, match="'reward/samples'.*dict per sample, got list"):
        collector.record("reward/samples", [1, 2], Reduce.SAMPLE)
    collector.record("ok", torch.tensor(2.5), Reduce.MEAN)  # a 0-d tensor is a number
    assert collector.drain() == {"ok": {"reduction": "mean", "sum": 2.5, "count": 1}}


def test_one_key_with_two_reductions_is_an_error_in_a_process_and_across_processes():
    collector = MetricCollector()
    collector.record("x", 1, Reduce.MEAN)
    with pytest.raises(ValueError, match="'x' is already recorded with Reduce.MEAN"):
        collector.record("x", 1, Reduce.MAX)
    other = MetricCollector()
    other.record("x", 1, Reduce.MAX)
    with pytest.raises(ValueError, match="'x' was recorded with different reductions"):
        reduce_states([collector.drain(), other.drain()])


def test_timer_spans_add_up_under_time_and_survive_an_exception():
    drain_states()
    with timer("phase"):
        time.sleep(0.02)
    with pytest.raises(RuntimeError), timer("phase"):
        time.sleep(0.03)
        raise RuntimeError("boom")
    state = drain_states()["time/phase_s"]
    assert state["reduction"] == "sum" and state["sum"] >= 0.05  # both spans, the one that raised included


@pytest.fixture
def config():
    return load_config(E2E_CONFIGS / "tiny_qwen3_e2e.toml", {"wandb.enabled": "false"})


def test_logger_merges_recorded_and_plain_metrics_and_writes_jsonl(tmp_path, config, capsys):
    drain_states()
    logger = MetricsLogger(
        tmp_path,
        log_rollouts=config.run.log_rollouts,
        backends=[JsonlBackend(tmp_path / "metrics.jsonl", tmp_path / "samples.jsonl"), ConsoleBackend(samples=True)],
    )
    record_metric("reward/mean", 0.25)
    record_metric("reward/samples", {"episode_id": 0, "reward": 0.25}, Reduce.SAMPLE)
    actor = MetricCollector()
    actor.record("reward/mean", 0.75, Reduce.MEAN)
    merged = logger.log_step(3, {"loss": 1.5}, [actor.drain()])
    logger.close()
    assert merged == {"loss": 1.5, "reward/mean": 0.5}
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == {"step": 3, "loss": 1.5, "reward/mean": 0.5}
    assert [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()] == [
        {"step": 3, "key": "reward/samples", "episode_id": 0, "reward": 0.25}
    ]
    assert capsys.readouterr().out.splitlines() == [
        "  sample step 3 ? #0 reward=0.25 adv=- | '' -> ''",  # a sample with only an id and a reward
        "step    3 v0 reward/mean=0.5 loss=1.5",
    ]


def test_samples_reach_the_console_only_when_asked_one_line_each(capsys):
    sample = {
        "episode_id": 7,
        "task": "sum_digits",
        "prompt": "user: What is the sum of the digits of 47?\nAnswer with just the number.",
        "response": "4 + 7 = 11\nSo the answer is 11, which is the sum of the two digits of the number 47 given above.",
        "reward": 1.0,
        "advantage": 0.75,
        "status": "completed",
        "error": None,
    }
    ConsoleBackend().log_samples({"reward/samples": [sample]}, 3)  # the default: off
    assert capsys.readouterr().out == ""
    ConsoleBackend(samples=True).log_samples(
        {"reward/samples": [sample, {**sample, "error": "ValueError: bad row"}]}, 3
    )
    first, second = capsys.readouterr().out.splitlines()
    assert first == (
        "  sample step 3 sum_digits #7 reward=1 adv=0.75 completed | '…its of 47?⏎Answer with just the number.' -> "
        "'4 + 7 = 11⏎So the answer is 11, which is the sum of the two…'"
    )
    assert "error='ValueError: bad row'" in second


def test_outside_a_terminal_the_console_gets_whole_step_lines_and_no_progress_bar(tmp_path, capsys):
    """Under pytest stdout and stderr are not TTYs, as under CI, `| tee` or nohup: no bar redraws between the lines."""
    logger = MetricsLogger(tmp_path, log_rollouts=False, backends=[ConsoleBackend()])
    for step in logger.progress(0, 3):
        logger.write_step(step + 1, {"policy_version": step, "loss": 0.5}, {})
    logger.close()
    captured = capsys.readouterr()
    assert captured.out.splitlines() == [f"step    {step} v{step - 1} loss=0.5" for step in (1, 2, 3)]
    assert captured.err == ""


def test_a_key_both_recorded_and_in_the_plain_dict_is_an_error(tmp_path, config):
    drain_states()
    logger = MetricsLogger(tmp_path, log_rollouts=config.run.log_rollouts, backends=[])
    record_metric("loss", 1.0)
    with pytest.raises(ValueError, match=r"\['loss'\] were both recorded"):
        logger.log_step(1, {"loss": 2.0})
    logger.close()


def test_a_failing_backend_warns_once_and_the_others_go_on(tmp_path, config, capsys):
    full_disk = JsonlBackend(Path("/dev/full"), Path("/dev/full"))  # every flush fails with ENOSPC
    healthy = JsonlBackend(tmp_path / "metrics.jsonl", tmp_path / "samples.jsonl")
    logger = MetricsLogger(tmp_path, log_rollouts=config.run.log_rollouts, backends=[full_disk, healthy])
    for step in (1, 2, 3):
        logger.log_step(step, {"loss": float(step)})
    logger.close()
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "jsonl logging failed" in warnings[0] and "No space left on device" in warnings[0]
    assert [json.loads(line)["step"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]


@pytest.mark.processes
def test_wandb_backend_logs_scalars_and_a_samples_table_per_step(tmp_path):
    from rl.metrics.backends import WandbBackend
    from tests.support.wandb_records import history

    config = load_config(E2E_CONFIGS / "tiny_qwen3_e2e.toml", {"wandb.mode": "offline"})
    backend = WandbBackend(config.wandb, tmp_path, config.model_dump(mode="json"))
    backend.log_samples(
        {
            "reward/samples": [
                {"episode_id": 0, "target": None, "reward": 1.0},
                {"episode_id": 1, "target": "3", "reward": 0.5},
            ]
        },
        1,
    )
    backend.log({"loss": 0.5}, 1)
    backend.close()
    [wandb_file] = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    rows = history(wandb_file)
    assert [row.get("_step") for row in rows] == [1]
    [row] = rows
    assert row["loss"] == 0.5 and row["reward/samples"]["_type"] == "table-file"
    table = json.loads((wandb_file.parent / "files" / row["reward/samples"]["path"]).read_text())
    assert table["columns"] == ["episode_id", "target", "reward"] and table["data"] == [[0, None, 1.0], [1, "3", 0.5]]
