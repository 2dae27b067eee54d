"""A cgroup per sandboxed call: one cap on the memory and the number of processes of everything it starts.

Per-process limits (`setrlimit`) do not add up to a cap: four children of 512 MB each hold 2 GB. A
cgroup counts them together, and the kernel's OOM killer then stops the sandbox, not vLLM or the
trainer. Found once per process, in this order:

- cgroup v2: this process's cgroup (or its parent) on the `cgroup2` mount, writable, with `memory`
  and `pids` enabled for its children -- a delegated subtree (systemd `Delegate=yes`), or root on a
  v2 host;
- cgroup v1: the `memory` and `pids` hierarchies, writable (root on a v1 host, as on this
  project's CPU machines, whose `cgroup2` mount has no controllers);
- none: `available()` is None and the sandbox falls back to `RLIMIT_NPROC` (see tools/sandbox/).
"""

from __future__ import annotations

import functools
import os
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CgroupParents:
    """Where per-call cgroups are created: one directory (v2), or the memory and pids directories (v1)."""

    version: int
    memory: Path
    pids: Path


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, fs type, super options) of every mount of this process."""
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, rest = line.partition(" - ")
        fstype, _, options = rest.split(" ", 2) if rest.count(" ") >= 2 else (rest, "", "")
        mounts.append((fields.split(" ")[4], fstype, options))
    return mounts


def _own_paths() -> dict[str, str]:
    """This process's cgroup path per controller ("" for the v2 hierarchy)."""
    paths = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _usable(parent: Path) -> bool:
    """Whether a child cgroup can be created (and removed) under `parent`."""
    probe = parent / f"rlmesh-probe-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
        probe.rmdir()
        return True
    except OSError:
        return False


def _v2(mounts: list[tuple[str, str, str]], paths: dict[str, str]) -> CgroupParents | None:
    root = next((point for point, fstype, _ in mounts if fstype == "cgroup2"), None)
    if root is None or "" not in paths:
        return None
    own = Path(root + paths[""].rstrip("/"))
    for parent in (own, own.parent):
        try:
            enabled = (parent / "cgroup.subtree_control").read_text().split()
            if not {"memory", "pids"} <= set(enabled):
                (parent / "cgroup.subtree_control").write_text("+memory +pids")
        except OSError:
            continue
        if _usable(parent):
            return CgroupParents(2, parent, parent)
    return None


def _v1(mounts: list[tuple[str, str, str]], paths: dict[str, str]) -> CgroupParents | None:
    found = {}
    for controller in ("memory", "pids"):
        point = next(
            (point for point, fstype, options in mounts if fstype == "cgroup" and controller in options.split(",")),
            None,
        )
        if point is None or controller not in paths:
            return None
        found[controller] = Path(point + paths[controller].rstrip("/"))
        if not _usable(found[controller]):
            return None
    return CgroupParents(1, found["memory"], found["pids"])


@functools.cache
def available() -> CgroupParents | None:
    """Where this process can create per-call cgroups with a memory and a pids limit; None if nowhere."""
    if os.environ.get("RLMESH_SANDBOX_CGROUP", "auto") == "off":
        return None
    try:
        mounts, paths = _mounts(), _own_paths()
    except OSError:
        return None
    return _v2(mounts, paths) or _v1(mounts, paths)


class CallCgroup:
    """One call's cgroup: `memory_bytes` for all its processes together (no swap), at most `max_pids` of them."""

    def __init__(self, parents: CgroupParents, memory_bytes: int, max_pids: int):
        self.parents = parents
        name = f"rlmesh-sandbox-{uuid.uuid4().hex[:12]}"
        self.memory, self.pids = parents.memory / name, parents.pids / name
        self.dirs = [self.memory] if parents.version == 2 else [self.memory, self.pids]
        for directory in self.dirs:
            directory.mkdir()
        if parents.version == 2:
            _write_if_present(self.memory / "memory.swap.max", "0")
            (self.memory / "memory.max").write_text(str(memory_bytes))
            (self.memory / "pids.max").write_text(str(max_pids))
        else:
            (self.memory / "memory.limit_in_bytes").write_text(str(memory_bytes))
            _write_if_present(self.memory / "memory.memsw.limit_in_bytes", str(memory_bytes))
            (self.pids / "pids.max").write_text(str(max_pids))

    @property
    def procs_files(self) -> list[str]:
        """The `cgroup.procs` files a process writes its pid into to enter this cgroup (before it starts anything)."""
        return [str(directory / "cgroup.procs") for directory in self.dirs]

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of this cgroup for going over its memory limit."""
        events = self.memory / ("memory.events" if self.parents.version == 2 else "memory.oom_control")
        try:
            for line in events.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill" and int(value) > 0:
                    return True
        except OSError:
            pass
        return False

    def kill(self) -> None:
        """SIGKILL every process in the cgroup, until none is left (blocking: run it off the event loop)."""
        for _ in range(1000):
            pids = self._pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def kill_and_remove(self, wait_s: float = 30.0) -> None:
        """`kill`, then remove the cgroup once its killed processes are gone (a fork bomb's take a while to be
        reaped); after `wait_s` it is left in place, empty of live processes."""
        deadline = time.monotonic() + wait_s
        for directory in self.dirs:
            while True:
                self.kill()
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:  # EBUSY until the killed processes are gone
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.01)

    def _pids(self) -> list[int]:
        pids: set[int] = set()
        for procs in self.procs_files:
            try:
                pids.update(int(pid) for pid in Path(procs).read_text().split())
            except OSError:
                pass
        return sorted(pids)


def _write_if_present(path: Path, value: str) -> None:
    if path.exists():
        path.write_text(value)
