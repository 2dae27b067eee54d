"""Running tool code on model-chosen arguments in a sandboxed subprocess.

Every call runs `fn(**arguments)` in a fresh Python process and returns its result as text, or
a `SandboxError` saying what stopped it. What `isolate=True` (the default) enforces, all through
the Linux kernel, without root (unprivileged user namespaces; checked at start):

- its own root: a minimal read-only tree of `/usr` (and the `/bin`, `/lib*` links), the Python
  installation, the venv, and the importable packages and modules of `sys.path`'s other entries --
  no home directories, no run directory, no data files, no other rollouts, no host `/tmp`, `/run`
  or `/var/run` (so no path-based Unix socket of Monarch, vLLM or wandb can be reached);
- a private scratch directory, `/tmp`: the working directory, `HOME` and `TMPDIR`, a tmpfs of
  `scratch_mb` that ends with the call (calls share no files; nothing is left on the host);
- a minimal `/dev` (null, zero, full, random, urandom, a private `/dev/shm` of `scratch_mb`):
  no GPU, KVM or other device;
- new user, network (no interface but a loopback that is down), PID, mount, IPC (no SysV or POSIX
  shared memory of the host) and UTS namespaces; every capability dropped, no new privileges;
- one cap for the whole sandbox where a cgroup can be had (`tools/cgroup.py`): `memory_mb` for all
  its processes together, at most `max_processes` processes. Where none can, the fallback is
  `RLIMIT_NPROC = max_processes`, counted per user namespace, so it caps the sandbox's processes
  alone (a fork bomb stops there) -- except when rlmesh runs as root: the kernel does not apply
  RLIMIT_NPROC to uid 0, so root without a writable cgroup has no process cap (documented in
  docs/writing-a-task.md). Memory is then bounded per process only (`RLIMIT_AS`), i.e. at up to
  `max_processes * memory_mb`;
- per-process limits (`setrlimit`, set by the runner before the tool is imported): address space
  `memory_mb`, CPU time, size of any file written, open files; and a wall-clock `timeout_s` after
  which the whole process tree is killed;
- output read as it arrives: more than 1 MiB of stdout stops the tool, stderr keeps its last 4 KiB.

The namespaces come from bubblewrap (`bwrap`, installed by scripts/setup_env.sh where it can) or,
where it is missing, from util-linux `unshare` and a setup script doing the same mounts.
What it does not do: no seccomp filter (any syscall the kernel allows an unprivileged user
namespace is allowed); the tool can read everything in the tree above (the project's source,
the venv). `isolate=False` (machines without user namespaces) keeps only the limits, the output
caps and the timeout, which kills the tool's process group (and, with a cgroup, every process of
the call): there is NO file-system, network, device or IPC isolation, and without a cgroup a
process that leaves the process group survives the call.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import importlib.util
import io
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import traceback
from contextlib import redirect_stdout
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rl.console import warn
from tools import cgroup

MAX_OUTPUT_BYTES = 1 << 20
"""Stdout a call may write (its result included); past it the tool is killed and the model told."""
STDERR_TAIL_BYTES = 4096
_CHUNK = 1 << 16
_SCRATCH = "/tmp"

# Runs inside `unshare`'s new namespaces as the namespace's root (the fallback when bwrap is missing):
# builds the minimal tree in a tmpfs, pivots into it, drops every capability and execs the runner.
_UNSHARE_SETUP = r"""
set -eu
R="$RLMESH_ROOT"
mount -t tmpfs -o size=1m,mode=755 rlmesh-root "$R"
mkdir -p "$R/tmp"
mount -t tmpfs -o "size=$RLMESH_SCRATCH_BYTES,mode=1777" rlmesh-scratch "$R/tmp"  # first: binds under /tmp land on it
IFS='
'
for p in $RLMESH_BINDS; do
    if [ -d "$p" ]; then mkdir -p "$R$p"; else mkdir -p "$R${p%/*}"; : > "$R$p"; fi
    mount --bind "$p" "$R$p"
    mount -o remount,bind,ro "$R$p"
done
for link in $RLMESH_LINKS; do ln -s "${link#*=}" "$R${link%%=*}"; done
mkdir -p "$R/dev" "$R/proc"
mount -t tmpfs -o size=64k,mode=755 rlmesh-dev "$R/dev"
for device in null zero full random urandom; do : > "$R/dev/$device"; mount --bind "/dev/$device" "$R/dev/$device"; done
ln -s /proc/self/fd "$R/dev/fd"
ln -s /proc/self/fd/0 "$R/dev/stdin"; ln -s /proc/self/fd/1 "$R/dev/stdout"; ln -s /proc/self/fd/2 "$R/dev/stderr"
mkdir "$R/dev/shm"
mount -t tmpfs -o "size=$RLMESH_SCRATCH_BYTES,mode=1777" rlmesh-shm "$R/dev/shm"
mount -o remount,ro,bind "$R/dev"
mount -t proc proc "$R/proc"
mount -o remount,ro,bind "$R"
cd "$R"
pivot_root . .
umount -l .
cd /tmp
exec setpriv --inh-caps=-all --bounding-set=-all --no-new-privs -- "$@"
"""

# Enters the call's cgroup before anything else starts, so every process of the call is in it.
_ENTER_CGROUP = 'for procs in $RLMESH_CGROUP_PROCS; do echo $$ > "$procs"; done; exec "$@"'


class SandboxError(Exception):
    """A tool call that did not return: it raised, ran out of time or memory, or broke a rule."""


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 5.0
    """Wall-clock time of one call, process start included."""
    cpu_s: int = 5
    memory_mb: int = 512
    """Memory of the whole sandbox with a cgroup, else address space of each process (Python needs ~30 MB)."""
    max_processes: int = 16
    """Processes and threads of the sandbox (the tool runner is one)."""
    max_file_mb: int = 16
    scratch_mb: int = 64
    """Size of the scratch tmpfs (and of `/dev/shm`); with a cgroup it counts towards `memory_mb` too."""
    max_open_files: int = 64


def namespaces_available() -> bool:
    """Whether unprivileged user, network, PID, mount, IPC and UTS namespaces work on this machine."""
    return _backend() is not None


@functools.cache
def _backend() -> str | None:
    """`bwrap` when it is installed and works here, else `unshare` (same tree, built by `_UNSHARE_SETUP`) when
    that works, else None. `RLMESH_SANDBOX_BACKEND=unshare` forces the fallback (its tests)."""
    forced = os.environ.get("RLMESH_SANDBOX_BACKEND")
    if forced != "unshare" and shutil.which("bwrap") is not None:
        probe = ["bwrap", "--unshare-all", "--unshare-user", "--ro-bind", "/", "/", "true"]
        if subprocess.run(probe, capture_output=True, timeout=30).returncode == 0:
            return "bwrap"
    if any(shutil.which(tool) is None for tool in ("unshare", "setpriv", "pivot_root")):
        return None
    probe = ["unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--mount", "--ipc", "--uts", "true"]
    return "unshare" if subprocess.run(probe, capture_output=True, timeout=30).returncode == 0 else None


@functools.cache
def _tree(fn_module: str) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """(paths bound read-only at the same place, (link, target) symlinks) of the sandbox's root.

    The OS (`/usr`, the dynamic loader's cache), the Python installation and venv, and for every
    other `sys.path` entry only what can be imported from it (packages and modules), so a project
    directory's `runs/` and `data/` stay out; plus wherever the tool's own package and this runner
    are imported from (an editable install maps them elsewhere).
    """
    paths: set[str] = {"/usr", "/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives"}
    links = []
    for name in ("bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        path = Path("/") / name
        if path.is_symlink():
            links.append((str(path), os.readlink(path)))
        elif path.is_dir():
            paths.add(str(path))
    prefixes = {os.path.realpath(prefix) for prefix in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    paths.update(prefixes)
    paths.add(os.path.dirname(os.path.realpath(sys.executable)))
    for entry in filter(None, sys.path):
        entry = os.path.realpath(entry)
        if not os.path.isdir(entry) or any(entry == prefix or entry.startswith(prefix + os.sep) for prefix in prefixes):
            continue
        for child in os.scandir(entry):
            importable = child.name.endswith(".py") or (
                child.is_dir() and os.path.exists(os.path.join(child.path, "__init__.py"))
            )
            if importable and not child.name.startswith("."):
                paths.add(child.path)
    for top in {fn_module.partition(".")[0], "tools"}:
        spec = importlib.util.find_spec(top)
        for location in (spec.submodule_search_locations or [spec.origin]) if spec is not None else []:
            if location:
                paths.add(os.path.realpath(location))
    existing = sorted(path for path in paths if os.path.exists(path))
    # a path inside another bound path is already there
    kept = [
        path for path in existing if not any(path.startswith(other + os.sep) for other in existing if other != path)
    ]
    return tuple(kept), tuple(links)


def _interpreter() -> str:
    """This interpreter's path with its directory resolved: the sandbox binds only resolved paths, so a venv
    reached through a symbolic link (`/opt/env -> /data/venv`) is not there under the link's name. The last
    component stays as it is: `venv/bin/python` (itself a link to the base interpreter) is how Python finds
    the venv's `pyvenv.cfg` and site-packages."""
    return os.path.join(os.path.realpath(os.path.dirname(sys.executable)), os.path.basename(sys.executable))


class Sandbox:
    """Runs tool functions, each call in a fresh sandbox (see the module docstring for what is isolated)."""

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
            command, env, cwd = self._command(fn_path, group, host_dirs)
            nproc = (
                self.isolate and group is None
            )  # outside a user namespace RLIMIT_NPROC would count all this user's processes
            request = json.dumps({"fn": fn_path, "arguments": arguments, "limits": asdict(self.limits), "nproc": nproc})
            return await self._communicate(command, env, cwd, request.encode(), group)
        finally:
            if group is not None:
                await asyncio.shield(asyncio.to_thread(group.kill_and_remove))
            for directory in host_dirs:
                _remove_tree(directory)

    def _command(
        self, fn_path: str, group: cgroup.CallCgroup | None, host_dirs: list[str]
    ) -> tuple[list[str], dict[str, str], str]:
        runner = [_interpreter(), "-P", "-s", "-m", "tools.sandbox"]  # -P: no script directory or cwd on sys.path
        python_path = os.pathsep.join(os.path.realpath(path) for path in sys.path if path and os.path.isdir(path))
        env = {
            "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
            "PYTHONPATH": python_path,
            "PYTHONDONTWRITEBYTECODE": "1",
            "OMP_NUM_THREADS": "1",
            "OPENBLAS_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            "LANG": "C.UTF-8",
        }
        if self.isolate:
            env.update(HOME=_SCRATCH, TMPDIR=_SCRATCH)
            binds, links = _tree(fn_path.partition(":")[0])
            if _backend() == "bwrap":
                scratch = str(self.limits.scratch_mb << 20)
                # scratch first: a checkout or venv under /tmp is bound on top of it, not hidden by it
                command = [
                    "bwrap",
                    "--unshare-all",
                    "--unshare-user",
                    "--die-with-parent",
                    "--new-session",
                    "--cap-drop",
                    "ALL",
                    "--size",
                    scratch,
                    "--tmpfs",
                    _SCRATCH,
                ]
                for path in binds:
                    command += ["--ro-bind", path, path]
                for link, target in links:
                    command += ["--symlink", target, link]
                command += [
                    "--proc",
                    "/proc",
                    "--dev",
                    "/dev",
                    "--remount-ro",
                    "/dev",
                    "--size",
                    scratch,
                    "--tmpfs",
                    "/dev/shm",
                    "--remount-ro",
                    "/",
                    "--chdir",
                    _SCRATCH,
                    "--",
                    *runner,
                ]
            else:
                root = tempfile.mkdtemp(
                    prefix="rlmesh-sandbox-root-"
                )  # an empty mount point, never written on the host
                host_dirs.append(root)
                env.update(
                    RLMESH_ROOT=root,
                    RLMESH_BINDS="\n".join(binds),
                    RLMESH_SCRATCH_BYTES=str(self.limits.scratch_mb << 20),
                    RLMESH_LINKS="\n".join(f"{link}={target}" for link, target in links),
                )
                command = [
                    "unshare",
                    "--user",
                    "--map-root-user",
                    "--net",
                    "--pid",
                    "--fork",
                    "--kill-child=SIGKILL",
                    "--mount",
                    "--ipc",
                    "--uts",
                    "--propagation",
                    "private",
                    "sh",
                    "-c",
                    _UNSHARE_SETUP,
                    "sandbox-setup",
                    *runner,
                ]
            cwd = "/"
        else:
            cwd = tempfile.mkdtemp(prefix="rlmesh-sandbox-")
            host_dirs.append(cwd)
            env.update(HOME=cwd, TMPDIR=cwd)
            command = runner
        if group is not None:
            env["RLMESH_CGROUP_PROCS"] = " ".join(group.procs_files)
            command = ["sh", "-c", _ENTER_CGROUP, "sandbox-cgroup", *command]
        return command, env, cwd

    async def _communicate(
        self, command: list[str], env: dict[str, str], cwd: str, request: bytes, group: cgroup.CallCgroup | None
    ) -> str:
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
        stdout, stderr = bytearray(), bytearray()
        overflow = asyncio.Event()

        async def feed() -> None:
            try:
                process.stdin.write(request)
                await process.stdin.drain()
                process.stdin.close()
            except (BrokenPipeError, ConnectionResetError):
                pass

        async def drain_stdout() -> None:
            while chunk := await process.stdout.read(_CHUNK):
                stdout.extend(chunk)
                if len(stdout) > MAX_OUTPUT_BYTES:
                    overflow.set()
                    return

        async def drain_stderr() -> None:
            while chunk := await process.stderr.read(_CHUNK):
                stderr.extend(chunk)
                del stderr[:-STDERR_TAIL_BYTES]

        async def finish() -> None:
            await asyncio.gather(feed(), drain_stdout(), drain_stderr())
            await process.wait()

        finished = asyncio.ensure_future(finish())
        stopped = asyncio.ensure_future(overflow.wait())
        try:
            done, _ = await asyncio.wait(
                {finished, stopped}, timeout=self.limits.timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            if stopped in done:
                raise SandboxError(f"the tool wrote more than {MAX_OUTPUT_BYTES >> 20} MiB of output and was stopped")
            if finished not in done:
                raise SandboxError(f"the tool took longer than {self.limits.timeout_s:g} s and was stopped")
            finished.result()
        finally:
            stopped.cancel()
            if process.returncode is None:
                _kill_group(process.pid)
            if group is not None:
                await asyncio.shield(asyncio.to_thread(group.kill))
            finished.cancel()
            await asyncio.shield(_reap(process, finished))
        out_of_memory = group is not None and group.oom_killed()
        return _read_result(process.returncode, bytes(stdout), bytes(stderr), self.limits, out_of_memory)

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


def _apply_limits(limits: SandboxLimits, nproc: bool) -> None:
    """In the runner, before the tool is imported: the limits every process it starts inherits (the hard
    limits cannot be raised again: no capability is left)."""

    def cap(kind: int, value: int) -> None:
        resource.setrlimit(kind, (value, value))

    cap(resource.RLIMIT_AS, limits.memory_mb << 20)
    resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
    cap(resource.RLIMIT_FSIZE, limits.max_file_mb << 20)
    cap(resource.RLIMIT_NOFILE, limits.max_open_files)
    cap(resource.RLIMIT_CORE, 0)
    if nproc:
        cap(resource.RLIMIT_NPROC, limits.max_processes)


async def _reap(process: asyncio.subprocess.Process, readers: asyncio.Future) -> None:
    """Wait for the killed tool's exit. asyncio's `wait()` returns only once every pipe is closed, and a stdout that
    stopped being read (the output cap) is paused with bytes left in it: read both pipes to their end first."""
    await asyncio.wait({readers})
    process.stdin.close()
    while await process.stdout.read(_CHUNK):
        pass
    while await process.stderr.read(_CHUNK):
        pass
    await process.wait()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _read_result(
    returncode: int, stdout: bytes, stderr: bytes, limits: SandboxLimits, out_of_memory: bool = False
) -> str:
    """The tool's result from the runner's last stdout line; anything malformed is a `SandboxError` for the model."""
    if out_of_memory:
        raise SandboxError(f"the tool ran out of memory (the sandbox's limit is {limits.memory_mb} MB) and was killed")
    lines = stdout.decode(errors="replace").strip().splitlines()
    try:
        result = json.loads(lines[-1]) if lines else None
    except (json.JSONDecodeError, RecursionError):
        result = None
    if result is None:
        # unshare --fork re-raises its child's fatal signal on itself; for SIGKILL (the hard CPU limit)
        # that fails and it exits 1 with "sigprocmask unblock failed" instead.
        killed_inside_unshare = b"sigprocmask unblock failed" in stderr
        if killed_inside_unshare or returncode in (
            -signal.SIGXCPU,
            128 + signal.SIGXCPU,
            -signal.SIGKILL,
            128 + signal.SIGKILL,
        ):
            raise SandboxError(f"the tool was killed (CPU limit {limits.cpu_s} s or a signal)")
        detail = stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit status {returncode}"]
        raise SandboxError(f"the tool process failed: {detail[0]}")
    if not isinstance(result, dict) or not isinstance(result.get("ok"), bool):
        raise SandboxError(
            f"the tool's output is malformed (its last line is not the runner's result): {lines[-1][:200]!r}"
        )
    field = "result" if result["ok"] else "error"
    if not isinstance(result.get(field), str):
        raise SandboxError(f"the tool's output is malformed ({field!r} is not text): {lines[-1][:200]!r}")
    text = result[field].encode("utf-8", errors="replace").decode("utf-8")  # lone surrogates cannot be tokenized
    if not result["ok"]:
        raise SandboxError(text)
    return text


def _describe(exc: BaseException) -> str:
    """What the model is told: the exception line (a denied write reads `OSError: [Errno 30] Read-only file system`)."""
    if isinstance(exc, MemoryError):
        return "the tool ran out of memory (limit reached)"
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def _child_main() -> None:
    """Inside the sandbox: read the request from stdin, set the limits, call the function, print one JSON line."""
    request = json.loads(sys.stdin.read())
    _apply_limits(SandboxLimits(**request["limits"]), request["nproc"])
    printed = io.StringIO()
    try:
        module_name, _, attr = request["fn"].partition(":")
        fn = getattr(importlib.import_module(module_name), attr)
        with redirect_stdout(printed):
            value = fn(**request["arguments"])
        text = printed.getvalue() if value is None else value if isinstance(value, str) else json.dumps(value)
        result = {"ok": True, "result": text}
    except BaseException as exc:
        result = {"ok": False, "error": _describe(exc)}
    sys.stdout.write("\n" + json.dumps(result) + "\n")


if __name__ == "__main__":
    _child_main()
