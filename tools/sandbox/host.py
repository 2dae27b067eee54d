"""The host side of the sandbox: `Sandbox.run` builds one call's command, runs it through the IO pump and
reads its result (see `tools.sandbox` for what is isolated)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from dataclasses import asdict
from typing import Any

from rl.console import warn
from tools import cgroup
from tools.sandbox.command import build_command, namespaces_available
from tools.sandbox.limits import SandboxLimits
from tools.sandbox.pump import communicate
from tools.sandbox.result import read_result


class Sandbox:
    """Runs tool functions, each call in a fresh sandbox (`tools.sandbox` says what is isolated)."""

    def __init__(self, limits: SandboxLimits = SandboxLimits(), *, isolate: bool = True):
        if isolate and not namespaces_available():
            raise RuntimeError(
                "the tool sandbox needs unprivileged user namespaces (bubblewrap `bwrap`, or `unshare --user --net --pid "
                "--mount --ipc --uts` with `setpriv` and `pivot_root`); they are not available here. Pass isolate=False "
                "to run tools with limits only (no network, file-system, device or IPC isolation)."
            )
        if not isolate:
            warn(
                "tool sandbox with isolate=False: tools run as this user with only rlimits, output caps and a timeout; "
                "they can read and write its files, use the network, devices and shared memory, and (without a cgroup) "
                "a process that leaves its process group outlives the call"
            )
        self.limits = limits
        self.isolate = isolate

    async def run(self, fn_path: str, arguments: dict[str, Any]) -> str:
        """`fn(**arguments)` in the sandbox, `fn` given as `package.module:function`; its result as text."""
        parents = cgroup.available()
        group = None
        host_dirs: list[str] = []
        try:
            if parents is not None:  # a few writes to cgroupfs, done here so that a cancellation cannot orphan it
                group = cgroup.CallCgroup(
                    parents, (self.limits.memory_mb + self.limits.scratch_mb) << 20, self.limits.max_processes + 4
                )
            command, env, cwd = build_command(fn_path, self.limits, self.isolate, group, host_dirs)
            # outside a user namespace RLIMIT_NPROC would count all this user's processes
            nproc = self.isolate and group is None
            request = json.dumps({"fn": fn_path, "arguments": arguments, "limits": asdict(self.limits), "nproc": nproc})
            returncode, stdout, stderr = await communicate(command, env, cwd, request.encode(), self.limits, group)
            out_of_memory = group is not None and group.oom_killed()
            return read_result(returncode, stdout, stderr, self.limits, out_of_memory)
        finally:
            if group is not None:
                await asyncio.shield(asyncio.to_thread(group.kill_and_remove))
            for directory in host_dirs:
                _remove_tree(directory)

    def close(self) -> None:
        """Nothing to release: every call's scratch and processes end with the call."""


def _remove_tree(path: str) -> None:
    """Remove a host directory a call used, even one the tool made unreadable."""
    for root, dirs, _ in os.walk(path):
        for name in dirs:
            try:
                os.chmod(os.path.join(root, name), 0o700)
            except OSError:
                pass
    shutil.rmtree(path, ignore_errors=True)
