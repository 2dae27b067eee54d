"""Run directories for the tests: a fake one with checkpoints as a run writes them, and checks on a real one's logs."""

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from rl.checkpoint import store as checkpoint
from rl.config import dump_toml, load_config
from rl.loop.state import row_index_of
from tests.support.paths import REPO, TINY


def fake_run(
    tmp_path: Path, steps_with_checkpoints: list[int], committed: bool = True, damage_before_commit=None
) -> Path:
    """A run directory with checkpoints as the run writes them, but a 4096-float trainer state; `damage_before_commit(tmp)`
    spoils a checkpoint before its manifest is taken (bad from the start, yet matching its manifest)."""
    run_dir = tmp_path / "run"
    config = load_config(TINY, {"run.steps": "10"})  # unfinished at every step it has a checkpoint of
    run_dir.mkdir()
    (run_dir / "config.toml").write_text(dump_toml(config))
    for step in steps_with_checkpoints:
        tmp = checkpoint.begin(run_dir, step)
        (tmp / "config.toml").write_text(dump_toml(config))
        (tmp / "run_state.json").write_text(
            json.dumps({"step": step, "policy_version": step, "data_cursor": 2 * step, "rows_done_ahead": []})
        )
        dcp.save({"model": {"w": torch.arange(4096.0)}}, checkpoint_id=tmp / "trainer")
        checkpoint.write(tmp, checkpoint.RNG, "controller")
        if damage_before_commit is not None and step == steps_with_checkpoints[-1]:
            damage_before_commit(tmp)
        if committed:
            checkpoint.commit(run_dir, tmp, step, keep=2)
    return run_dir


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_rows_trained_once(run_dir: Path, steps: int, groups_per_step: int, group_size: int) -> None:
    """From rollouts.jsonl and the data cursor: each row's group trained in exactly one step, every rollout once,
    and every row the cursor has passed trained or evicted as stale (counted in metrics.jsonl), none skipped."""
    train = [record for record in read_jsonl(run_dir / "rollouts.jsonl") if record["kind"] == "train"]
    ids = [record["rollout"]["rollout_id"] for record in train]
    assert len(ids) == len(set(ids)) == steps * groups_per_step * group_size
    steps_of_row: dict[int, set[int]] = {}
    for record in train:
        steps_of_row.setdefault(row_index_of(record["rollout"]["group_id"]), set()).add(record["step"])
    assert all(len(row_steps) == 1 for row_steps in steps_of_row.values()), steps_of_row
    assert Counter(step for row_steps in steps_of_row.values() for step in row_steps) == {
        step: groups_per_step for step in range(1, steps + 1)
    }
    state = checkpoint.read(checkpoint.newest_checkpoint(run_dir), checkpoint.RUN_STATE)
    assert state["step"] == steps
    consumed = set(range(state["data_cursor"])) | set(state["rows_done_ahead"])
    metrics = [record for record in read_jsonl(run_dir / "metrics.jsonl") if record["step"] > 0]
    assert [record["step"] for record in metrics] == list(range(1, steps + 1))  # no step's record lost
    assert sum(record["rollouts/dropped_groups"] for record in metrics) == 0
    evicted = sum(record["rollouts/evicted_stale_groups"] for record in metrics)
    assert set(steps_of_row) <= consumed and len(consumed) - len(steps_of_row) == evicted


EXACT_RUN = ("--run.steps", "6", "--tasks.0.rubric.reward_fns", "[{fn = 'tests.support.e2e_rewards:even_token_share'}]")
"""The tiny run (6 steps, a reward that varies across samples: nonzero advantages and losses) whose resumed and recovered
copies must equal its uninterrupted one (`tests/e2e/conftest.py`'s `clean_tiny_run`)."""


def train_to_end(*args: str) -> None:
    """`rlmesh train *args` in a subprocess, which must exit 0."""
    result = subprocess.run(
        [sys.executable, "-m", "rl.commands.cli", "train", *args], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def comparable(record: dict) -> dict:
    """A metrics record without wall-clock quantities, the services' counters (counted since the launcher started) and
    the recovery's."""
    return {
        key: value
        for key, value in record.items()
        if not key.startswith(("time/", "perf/", "services/", "recovery/", "memory/")) and not key.endswith("_per_s")
    }


def assert_same_run(run_dir: Path, clean_dir: Path, steps: int, interrupted_at: tuple[int, ...] = ()) -> None:
    """`run_dir` logged what the uninterrupted `clean_dir` logged: every step's metrics (`comparable`), and every
    rollout's tokens (rollouts.jsonl line for line). At the steps a Ctrl-C or SIGTERM committed (`interrupted_at`) held-out
    eval metrics and rollouts are left out of both: a step the signal ends is committed without its eval."""

    def without_eval(records: list[dict], key) -> list[dict]:
        return [
            {name: value for name, value in record.items() if not name.startswith("eval/")}
            if record["step"] in interrupted_at
            else record
            for record in records
            if not (record["step"] in interrupted_at and key(record))
        ]

    clean, run = read_jsonl(clean_dir / "metrics.jsonl"), read_jsonl(run_dir / "metrics.jsonl")
    assert [record["step"] for record in run] == [record["step"] for record in clean] and clean[-1]["step"] == steps
    assert any(record.get("loss", 0.0) != 0.0 for record in clean)
    assert [comparable(record) for record in without_eval(run, key=lambda record: False)] == [
        comparable(record) for record in without_eval(clean, key=lambda record: False)
    ]
    if not interrupted_at:
        assert (run_dir / "rollouts.jsonl").read_text() == (clean_dir / "rollouts.jsonl").read_text()
        return
    clean_rollouts = without_eval(read_jsonl(clean_dir / "rollouts.jsonl"), key=lambda record: record["kind"] == "eval")
    assert (
        without_eval(read_jsonl(run_dir / "rollouts.jsonl"), key=lambda record: record["kind"] == "eval")
        == clean_rollouts
    )
