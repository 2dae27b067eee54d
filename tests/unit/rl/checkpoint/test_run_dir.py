"""A run directory has one writer: claimed atomically, locked for the run, a second writer or resume refused."""

import errno
import json
import os
import subprocess
import sys

import pytest

from rl.checkpoint import run_dir
from rl.checkpoint import store as checkpoint
from rl.checkpoint.resume import open_run_dir
from tests.support.paths import REPO
from tests.support.runs import fake_run

pytestmark = pytest.mark.processes  # other writers of a run directory are processes


def test_a_new_run_never_appends_to_an_old_run_directory(tmp_path):
    claimed, held = run_dir.claim_fresh(tmp_path / "run")  # missing: created
    assert claimed == tmp_path / "run"
    held.release()
    claimed, held = run_dir.claim_fresh(tmp_path / "run")  # empty (but for its lock file): reused
    assert claimed == tmp_path / "run"
    held.release()
    (tmp_path / "run" / "metrics.jsonl").write_text("{}\n")
    claimed, held = run_dir.claim_fresh(tmp_path / "run")
    assert claimed == tmp_path / "run-1"
    held.release()
    (tmp_path / "run-1" / "metrics.jsonl").write_text("{}\n")
    assert run_dir.claim_fresh(tmp_path / "run")[0] == tmp_path / "run-2"
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == "{}\n"


def test_two_runs_started_together_with_one_name_get_different_directories(tmp_path):
    first, first_lock = run_dir.claim_fresh(tmp_path / "run")
    second, second_lock = run_dir.claim_fresh(tmp_path / "run")  # the first has written nothing yet
    assert (first, second) == (tmp_path / "run", tmp_path / "run-1")
    with pytest.raises(
        run_dir.RunDirBusy, match=rf"{first} is in use by pid \d+ on .* since .*; a run directory has one writer"
    ):
        run_dir.lock(first)
    first_lock.release()
    run_dir.lock(first).release()  # free again once its writer let go
    second_lock.release()


def test_a_second_resume_of_a_running_run_is_refused(tmp_path):
    directory = fake_run(tmp_path, [1])
    held = run_dir.lock(directory)  # the first launcher, still running
    try:
        result = subprocess.run(
            [sys.executable, "-m", "rl.commands.cli", "train", "--resume", str(directory)],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        held.release()
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"rlmesh: cannot resume: {directory} is in use by pid" in result.stderr


def test_a_resume_through_the_python_api_is_refused_while_another_process_writes_the_run(tmp_path):
    directory = fake_run(tmp_path, [1])
    resume_from = checkpoint.newest_checkpoint(directory)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from rl.checkpoint import run_dir; "
            "held = run_dir.lock(Path(sys.argv[1])); print('held', flush=True); time.sleep(60)",
            str(directory),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(run_dir.RunDirBusy, match=rf"{directory} is in use by pid {holder.pid} "):
            open_run_dir(directory, "", resume_from)  # what `Controller(config, resume_from=...)` calls
    finally:
        holder.kill()
        holder.wait()


def test_a_resume_through_the_python_api_takes_the_lock_and_repairs_the_logs(tmp_path):
    directory = fake_run(tmp_path, [1])
    resume_from = checkpoint.newest_checkpoint(directory)
    whole = json.dumps({"step": 1, "loss": 0.5}) + "\n"
    (directory / "metrics.jsonl").write_text(whole + '{"step": 2, "lo')  # killed mid-write
    resumed, held = open_run_dir(directory, "", resume_from)
    try:
        assert resumed == directory and run_dir.held_here(directory)
        assert (directory / "metrics.jsonl").read_text() == whole
        second = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from pathlib import Path; from rl.checkpoint import run_dir; "
                "run_dir.lock(Path(sys.argv[1]))",
                str(directory),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        assert second.returncode != 0 and "RunDirBusy" in second.stderr
    finally:
        held.release()
    assert not run_dir.held_here(directory)


@pytest.mark.parametrize("code", [errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP])
def test_a_filesystem_without_flock_is_named_with_the_fix(tmp_path, monkeypatch, code):
    def no_locks(fd, operation):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(run_dir.fcntl, "flock", no_locks)
    with pytest.raises(
        run_dir.RunDirUnlockable, match=rf"does not support flock \({errno.errorcode[code]}\).*run.output_dir"
    ):
        run_dir.lock(tmp_path)
    assert not run_dir.held_here(tmp_path)


def test_the_run_directory_a_process_claimed_is_found_by_its_pid_after_it_ended(tmp_path):
    """`claim_fresh` may give `run-1`, `run-2`, ... (after locking `run` too, to look inside): a guarded launcher's
    parent finds which one its dead child kept from the lock files' holder lines, which stay after the lock is
    released."""
    first, first_lock = run_dir.claim_fresh(tmp_path / "run")
    (first / "metrics.jsonl").write_text("{}\n")  # not empty: the next claim takes run-1
    first_lock.release()
    child = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from pathlib import Path; from rl.checkpoint import run_dir; print(run_dir.claim_fresh(Path(sys.argv[1]))[0])",
            str(tmp_path / "run"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert child.stdout.strip() == str(tmp_path / "run-1")
    pid = int((tmp_path / "run-1" / run_dir.LOCK).read_text().split()[1])
    assert run_dir.claimed_by(pid, tmp_path / "run") == tmp_path / "run-1"
    assert run_dir.claimed_by(pid + 1_000_000, tmp_path / "run") is None
