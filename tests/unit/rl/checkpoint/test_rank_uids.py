"""Ranks running under another uid than the launcher write a checkpoint's temporary directory, and the launcher
commits and later prunes it, when the run directory lets them (a shared group, `umask 002`: a cluster's usual set-up).

Each side runs in a forked child that drops root for its own uid and gid: the launcher as `daemon` (uid 1), a rank as
`nobody` (uid 65534), both in a group made up for the test. Skipped where the test does not run as root.
"""

import json
import os
import shutil
import stat
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

from rl.checkpoint import store as checkpoint

LAUNCHER_UID, RANK_UID, SHARED_GID = 1, 65534, 4242

pytestmark = [pytest.mark.processes, pytest.mark.skipif(os.geteuid() != 0, reason="switching to other uids needs root")]


def as_user(uid: int, umask: int, work: Callable[[], str | None]) -> str | None:
    """Run `work` in a forked child under `uid` (group SHARED_GID alone) and `umask`; its return value, or its
    error raised here."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(read_end)
        code = 0
        try:
            os.setgroups([])
            os.setgid(SHARED_GID)
            os.setuid(uid)
            os.umask(umask)
            answer = "ok:" + (work() or "")
        except BaseException:
            answer, code = "error:" + traceback.format_exc(), 1
        os.write(write_end, answer.encode())
        os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        answer = pipe.read().decode()
    os.waitpid(pid, 0)
    if answer.startswith("error:"):
        raise AssertionError(f"as uid {uid}: {answer.removeprefix('error:')}")
    return answer.removeprefix("ok:") or None


@pytest.fixture
def shared_base():
    """A directory every uid can reach (pytest's tmp_path is root's alone)."""
    base = Path(tempfile.mkdtemp(prefix="rlmesh-uids-"))
    base.chmod(0o755)
    os.chown(base, LAUNCHER_UID, SHARED_GID)
    yield base
    shutil.rmtree(base)


def rank_writes(tmp: Path, rank: int) -> Callable[[], None]:
    """What a rank leaves in a checkpoint: its trainer shard and its RNG state (plain files, under its own umask),
    making their folders when missing as torch.distributed.checkpoint and `save_rng` do."""

    def write() -> None:
        for part in ("trainer", "rng"):
            (tmp / part).mkdir(exist_ok=True)
        (tmp / "trainer" / f"__{rank}_0.distcp").write_bytes(bytes(range(256)) * (rank + 1))
        (tmp / "rng" / f"generator_{rank}.pt").write_bytes(b"rng of a rank")

    return write


def launcher_saves(run_dir: Path, step: int, ranks: list[int]) -> str:
    """Begin a checkpoint as the launcher, let ranks under RANK_UID write into it, then commit it (keep 1)."""
    tmp = Path(as_user(LAUNCHER_UID, 0o002, lambda: str(checkpoint.begin(run_dir, step))))
    for rank in ranks:
        as_user(RANK_UID, 0o022, rank_writes(tmp, rank))

    def commit() -> str:
        (tmp / "run_state.json").write_text(json.dumps({"step": step}))
        return str(checkpoint.commit(run_dir, tmp, step, keep=1))

    return as_user(LAUNCHER_UID, 0o002, commit)


def test_ranks_under_another_uid_write_a_checkpoint_that_the_launcher_commits_and_prunes(shared_base):
    run_dir = shared_base / "run"
    as_user(LAUNCHER_UID, 0o002, lambda: run_dir.mkdir())  # what claim_fresh does, under the user's umask
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o775

    first = Path(launcher_saves(run_dir, 1, ranks=[0, 1]))
    manifest = (first / checkpoint.MANIFEST).read_text()
    assert "trainer/__1_0.distcp" in manifest and "rng/generator_0.pt" in manifest
    assert (first / "trainer" / "__1_0.distcp").stat().st_uid == RANK_UID
    assert stat.S_IMODE(first.stat().st_mode) == 0o775

    second = Path(launcher_saves(run_dir, 2, ranks=[0, 1]))  # keep = 1: the launcher removes the ranks' files of step 1
    assert checkpoint.committed_checkpoints(run_dir) == [second]
    assert not first.exists()


def test_a_private_run_directory_keeps_other_uids_out(shared_base):
    """The permissions follow the run directory: under `umask 022` a rank of another uid cannot write (and is told)."""
    run_dir = shared_base / "private"
    as_user(LAUNCHER_UID, 0o022, lambda: run_dir.mkdir())
    tmp = Path(as_user(LAUNCHER_UID, 0o022, lambda: str(checkpoint.begin(run_dir, 1))))
    assert stat.S_IMODE(tmp.stat().st_mode) == 0o755
    with pytest.raises(AssertionError, match="PermissionError"):
        as_user(RANK_UID, 0o022, rank_writes(tmp, 0))
