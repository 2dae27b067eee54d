"""Checkpoints and `rlmesh train --resume`: refusals, and a killed run that resumes exactly."""

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rl.checkpoint import store as checkpoint
from rl.checkpoint.resume import restore_logs, resume_config, truncate_logs
from rl.config import ConfigError
from tests.support.runs import fake_run

REWARD = "[{fn = 'tests.support.e2e_rewards:even_token_share'}]"  # varies across samples: nonzero advantages and losses


def test_commit_renames_into_place_and_prunes_to_keep(tmp_path):
    run_dir = fake_run(tmp_path, [1, 2, 3])
    assert [path.name for path in checkpoint.committed_checkpoints(run_dir)] == ["step_00000002", "step_00000003"]
    assert checkpoint.newest_checkpoint(run_dir).name == "step_00000003"
    assert not list(checkpoint.checkpoint_root(run_dir).glob(".tmp-*"))


def test_resume_continues_from_the_newest_checkpoint_and_allows_longer_runs(tmp_path):
    run_dir = fake_run(tmp_path, [1, 2])
    config, newest = resume_config(
        run_dir, {"run.steps": "10", "wandb.enabled": "false", "checkpoint.every_steps": "5"}
    )
    assert newest.name == "step_00000002" and config.run.steps == 10


def test_resume_refuses_trajectory_changes_naming_the_keys(tmp_path):
    run_dir = fake_run(tmp_path, [1])
    with pytest.raises(
        ConfigError, match=r"different algorithm.group_size, model.path, tasks.0.args.num_digits: that would change"
    ):
        resume_config(
            run_dir,
            {"model.path": "smollm2-135m-instruct", "algorithm.group_size": "8", "tasks.0.args.num_digits": "3"},
        )


def test_resume_without_a_committed_checkpoint_is_refused(tmp_path):
    run_dir = fake_run(tmp_path, [1], committed=False)
    with pytest.raises(ConfigError, match="has no committed checkpoint"):
        resume_config(run_dir, {})
    with pytest.raises(ConfigError, match="not a run directory"):
        resume_config(tmp_path, {})


def test_truncate_logs_drops_records_after_the_checkpoint(tmp_path):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": step}) + "\n" for step in range(5)))
    truncate_logs(tmp_path, 2)
    assert (tmp_path / "metrics.jsonl").read_text().splitlines() == ['{"step": 0}', '{"step": 1}', '{"step": 2}']


def test_truncate_logs_drops_a_torn_last_line_with_a_warning(tmp_path, capsys):
    whole = "".join(json.dumps({"step": step, "loss": 0.5}) + "\n" for step in range(4))
    (tmp_path / "metrics.jsonl").write_text(whole + '{"step": 4, "lo')  # the launcher killed mid-write
    (tmp_path / "rollouts.jsonl").write_text(whole + '{"step": 3, "kind": "tr')
    truncate_logs(tmp_path, 3)
    assert (tmp_path / "metrics.jsonl").read_text() == whole
    assert (tmp_path / "rollouts.jsonl").read_text() == whole
    assert capsys.readouterr().err.count("line 5 is not a whole record (a write cut short): dropped") == 2


def test_a_damaged_newest_checkpoint_falls_back_to_the_previous_one_naming_why(tmp_path, capsys):
    run_dir = fake_run(tmp_path, [1, 2])
    data = checkpoint.checkpoint_root(run_dir) / "step_00000002" / "trainer" / "__0_0.distcp"
    size = data.stat().st_size
    with open(data, "r+b") as file:
        file.truncate(1000)
    _config, resumed_from = resume_config(run_dir, {})
    assert resumed_from.name == "step_00000001"
    assert (
        f"skipping checkpoint step_00000002: trainer/__0_0.distcp has 1000 bytes, {size} when committed"
        in capsys.readouterr().err
    )
    # same size, other bytes: none left
    (checkpoint.checkpoint_root(run_dir) / "step_00000001" / "run_state.json").write_text("{}")
    (checkpoint.checkpoint_root(run_dir) / "step_00000001" / "run_state.json").write_text("x" * 80)
    with pytest.raises(ConfigError, match="every committed checkpoint is damaged"):
        resume_config(run_dir, {})
    assert "run_state.json" in capsys.readouterr().err


def _truncate_trainer_data(tmp: Path) -> None:
    with open(tmp / "trainer" / "__0_0.distcp", "r+b") as file:
        file.truncate(1000)


@pytest.mark.parametrize(
    ("spoil", "reason"),
    [
        (
            _truncate_trainer_data,
            r"trainer/ does not load: ValueError: __0_0.distcp ends at byte 1000, its index reads to \d+",
        ),
        (
            lambda tmp: (tmp / "rng" / "controller.pt").write_bytes(b"not a tensor file"),
            "rng/ does not load: ValueError: controller.pt: ",
        ),
        (lambda tmp: (tmp / "run_state.json").write_text('{"step": '), "run_state.json does not load"),
        (lambda tmp: (tmp / "trainer" / ".metadata").unlink(), "trainer/ does not load"),
    ],
)
def test_a_checkpoint_that_matches_its_manifest_but_does_not_load_falls_back(tmp_path, capsys, spoil, reason):
    run_dir = fake_run(tmp_path, [1, 2], damage_before_commit=spoil)
    newest = checkpoint.newest_checkpoint(run_dir)
    assert newest.name == "step_00000002" and (newest / checkpoint.MANIFEST).is_file()
    assert resume_config(run_dir, {})[1].name == "step_00000001"
    assert re.search(f"skipping checkpoint step_00000002: {reason}", capsys.readouterr().err)


def test_a_checkpoint_written_before_manifests_is_still_checked(tmp_path, capsys):
    run_dir = fake_run(tmp_path, [1, 2])
    for path in checkpoint.committed_checkpoints(run_dir):
        (path / checkpoint.MANIFEST).unlink()
    assert resume_config(run_dir, {})[1].name == "step_00000002"  # whole: taken without a manifest
    _truncate_trainer_data(checkpoint.newest_checkpoint(run_dir))
    assert resume_config(run_dir, {})[1].name == "step_00000001"
    assert "skipping checkpoint step_00000002: trainer/ does not load" in capsys.readouterr().err


def test_checkpoints_newer_than_the_one_resumed_are_kept_aside(tmp_path):
    run_dir = fake_run(tmp_path, [1, 2])
    older = checkpoint.committed_checkpoints(run_dir)[0]
    assert [path.name for path in checkpoint.set_aside(run_dir, older)] == ["damaged-step_00000002"]
    # the resumed run's next commits never prune the older one for it
    assert checkpoint.committed_checkpoints(run_dir) == [older]


def test_checkpoint_files_and_directories_are_on_disk_before_committed(tmp_path, monkeypatch):
    synced: list[tuple[str, bool]] = []  # (path fsynced, whether COMMITTED existed then)
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append((os.readlink(f"/proc/self/fd/{fd}"), any(tmp_path.rglob(checkpoint.COMMITTED))))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    tmp = checkpoint.begin(tmp_path, 3)
    (tmp / "trainer" / "model.distcp").write_bytes(b"weights")
    (tmp / "run_state.json").write_text("{}")
    final = checkpoint.commit(tmp_path, tmp, 3, keep=1)
    before_commit = {Path(path).name for path, committed in synced if not committed}
    assert {"model.distcp", "trainer", "run_state.json", checkpoint.MANIFEST, tmp.name, "checkpoints"} <= before_commit
    # then COMMITTED
    assert [path for path, committed in synced if committed] == [
        str(final / checkpoint.COMMITTED),
        str(final),
    ]


@pytest.mark.processes
def test_a_commit_removes_only_its_own_or_dead_writers_temporaries(tmp_path):
    import socket

    import psutil

    live = psutil.Process(os.getppid())  # the process that started pytest: another writer that still runs
    root = checkpoint.checkpoint_root(tmp_path)
    root.mkdir()
    other_live = root / f".tmp-step_00000004-abc@{socket.gethostname()}-{live.pid}-{int(live.create_time() * 1000)}"
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    other_dead = root / f".tmp-step_00000004-def@{socket.gethostname()}-{dead}-1"
    for directory in (other_live, other_dead):
        directory.mkdir()
    own_stale = checkpoint.begin(tmp_path, 2)  # this writer's, abandoned
    assert own_stale.name.endswith(f"@{checkpoint.writer_identity()}")
    checkpoint.commit(tmp_path, checkpoint.begin(tmp_path, 3), 3, keep=1)
    assert other_live.is_dir() and not other_dead.exists() and not own_stale.exists()


def test_rng_states_round_trip_through_a_weights_only_load(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    checkpoint.write(tmp_path, checkpoint.RNG, "reward_0")
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    # plain containers and tensors only: no pickled objects run
    torch.load(tmp_path / "rng" / "reward_0.pt", weights_only=True)
    checkpoint.load_rng(tmp_path, "reward_0")
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_a_resume_logs_the_checkpoints_step_record_when_the_run_stopped_before_logging_it(tmp_path):
    run_dir = fake_run(tmp_path, [])
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": step, "loss": 0.5}) + "\n" for step in range(3)))
    tmp = checkpoint.begin(run_dir, 3)
    (tmp / "run_state.json").write_text(
        json.dumps({"step": 3, "policy_version": 3, "data_cursor": 6, "rows_done_ahead": []})
    )
    checkpoint.write(tmp, checkpoint.STEP_RECORD, {"loss": 0.25, "policy_version": 3}, {"train": [{"reward": 1.0}]})
    final = checkpoint.commit(run_dir, tmp, 3, keep=1)  # ... and the launcher was killed here, before logging step 3
    restore_logs(run_dir, final)
    restore_logs(run_dir, final)  # a second resume from the same checkpoint does not log it twice
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert records[-1] == {"step": 3, "loss": 0.25, "policy_version": 3} and len(records) == 4
    assert [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()] == [
        {"step": 3, "key": "train", "reward": 1.0}
    ]


def test_resuming_a_finished_run_without_new_steps_says_so_at_once(tmp_path):
    run_dir = fake_run(tmp_path, [1, 2])
    with pytest.raises(ConfigError, match=r"has finished its run.steps = 2 steps: nothing to resume. .*--run.steps N"):
        resume_config(run_dir, {"run.steps": "2"})
    assert resume_config(run_dir, {"run.steps": "3"})[1].name == "step_00000002"


def test_the_cli_says_a_finished_run_has_nothing_to_resume_and_starts_nothing(tmp_path, capsys):
    from rl.commands.cli import main

    run_dir = fake_run(tmp_path, [1, 2])
    assert main(["validate", "--resume", str(run_dir), "--run.steps", "2"]) == 0
    captured = capsys.readouterr()
    assert "has finished its run.steps = 2 steps: nothing to resume" in captured.err and captured.out == ""
