"""A run directory belongs to the one process that writes it: claimed atomically and locked for the run.

`runs/<name>/.lock` is held with `flock` by the launcher for as long as it writes the directory
(the kernel drops it when the process ends, however it ends, so a killed run leaves no stale lock).
A new run takes `runs/<name>`, or `runs/<name>-1`, `-2`, ... when that one is locked or not empty;
a second writer or `--resume` of a locked directory is refused with the holder named.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import time
from pathlib import Path

LOCK = ".lock"
_HELD: set[Path] = set()
"""Run directories this process holds the lock of (resolved paths)."""


class RunDirBusy(RuntimeError):
    """Another process holds the run directory's lock."""


class RunDirUnlockable(RuntimeError):
    """The run directory's filesystem has no working `flock` (some NFS and FUSE mounts)."""


_NO_LOCKS = (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL)


class RunDirLock:
    """The held lock of one run directory; `release` (or the process's end) frees it."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self._held = False
        # not inherited by actor processes
        self._fd: int | None = os.open(run_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(self._fd, 4096, 0).decode(errors="replace").strip() or "another process"
            self.release()
            raise RunDirBusy(f"{run_dir} is in use by {holder}; a run directory has one writer at a time") from None
        except OSError as exc:
            self.release()
            if exc.errno not in _NO_LOCKS:
                raise
            raise RunDirUnlockable(
                f"{run_dir}: its filesystem does not support flock ({errno.errorcode[exc.errno]}), which keeps a run "
                "directory to one writer; set run.output_dir to a local disk or a filesystem with locks "
                "(NFS: mount with lock support, not `nolock`)"
            ) from None
        os.ftruncate(self._fd, 0)
        os.pwrite(
            self._fd,
            f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n".encode(),
            0,
        )
        _HELD.add(run_dir.resolve())
        self._held = True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor of the open file drops the flock
            self._fd = None
        if self._held:  # a refused attempt leaves the holder in this process its mark
            self._held = False
            _HELD.discard(self.run_dir.resolve())


def claimed_by(pid: int, run_dir: Path) -> Path | None:
    """The directory among `run_dir`, `run_dir-1`, ... (`claim_fresh`'s candidates) that process `pid` claimed, held
    or not (a lock file keeps its last holder's line): the last candidate whose lock it took, since `claim_fresh`
    locks each one it tries and stops at the one it keeps. E.g. the run directory of a launcher that died."""
    suffixed = [path for path in run_dir.parent.glob(f"{run_dir.name}-*") if path.name.rsplit("-", 1)[1].isdigit()]
    candidates = [run_dir, *sorted(suffixed, key=lambda path: int(path.name.rsplit("-", 1)[1]))]
    claimed = None
    for candidate in candidates:
        try:
            holder = (candidate / LOCK).read_text()
        except OSError:
            continue
        if holder.startswith(f"pid {pid} on {socket.gethostname()} "):
            claimed = candidate
    return claimed


def held_here(run_dir: Path) -> bool:
    """Whether this process holds `run_dir`'s lock (`rlmesh train --resume` takes it before the controller starts)."""
    return run_dir.resolve() in _HELD


def lock(run_dir: Path) -> RunDirLock:
    """Lock an existing run directory (a resume); RunDirBusy if another process writes it."""
    return RunDirLock(run_dir)


def claim_fresh(run_dir: Path) -> tuple[Path, RunDirLock]:
    """`run_dir`, or `run_dir-1`, `run_dir-2`, ...: the first that is unlocked and empty, created and locked.

    Emptiness is checked under the lock, so two runs started together never share a directory,
    and a new run never appends to an old one.
    """
    candidate, suffix = run_dir, 0
    while True:
        candidate.mkdir(parents=True, exist_ok=True)
        try:
            held = RunDirLock(candidate)
        except RunDirBusy:
            held = None
        if held is not None:
            if not any(path.name != LOCK for path in candidate.iterdir()):
                return candidate, held
            held.release()
        suffix += 1
        candidate = run_dir.with_name(f"{run_dir.name}-{suffix}")
