"""The security review's sandbox payloads against the real `Sandbox` (each one must be stopped).

Every test is bounded by the sandbox: the flood, fork and memory payloads are stopped by its output
cap, its cgroup or its timeout, never by the test. The backend is whatever this machine has (bubblewrap
when installed, else `unshare`); `RLMESH_SANDBOX_BACKEND=unshare` runs the same tests on the fallback.
"""

import asyncio
import contextlib
import json
import os
import resource
import socket
import sys
import tempfile
import threading
from pathlib import Path

import psutil
import pytest

from tools import cgroup
from tools.sandbox import Sandbox, SandboxError, SandboxLimits

pytestmark = pytest.mark.processes  # every payload runs in a sandboxed subprocess

LIMITS = SandboxLimits(timeout_s=60.0, cpu_s=10, memory_mb=256, max_processes=16, scratch_mb=32)
"""Generous wall clock for a loaded machine: the payloads are stopped by the other limits."""
needs_cgroup = pytest.mark.skipif(
    cgroup.available() is None, reason="no writable cgroup here: memory is capped per process only"
)


async def run(fn, limits=LIMITS, isolate=True, **arguments):
    return await Sandbox(limits, isolate=isolate).run(f"tests.support.sandbox_payloads:{fn}", arguments)


async def listdir(path):
    return json.loads(await run("listdir", path=path))


async def written_by_a_call(name: str, timeout_s: float = 60) -> None:
    """Wait until a sandboxed call running under this process has written file `name` in its working directory
    (seen from here through /proc/<pid>/cwd, whatever mount namespace the call is in)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline:
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(OSError, psutil.Error):
                if Path(f"/proc/{child.pid}/cwd/{name}").exists():
                    return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no sandboxed call wrote {name} within {timeout_s} s")


async def test_host_unix_sockets_are_out_of_reach(tmp_path):
    path = str(tmp_path / "monarch.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen()
    server.settimeout(10)
    accepted = []
    threading.Thread(target=lambda: accepted.append(_accept(server)), daemon=True).start()
    try:
        with pytest.raises(SandboxError, match="FileNotFoundError"):
            await run("connect_unix", path=path)
        # the host's /tmp (Monarch, vLLM, wandb sockets) is not there: only the way to code bound from under it
        code_under_tmp = {
            Path(os.path.realpath(entry)).parts[2]
            for entry in sys.path
            if os.path.realpath(entry or ".").startswith("/tmp/")
        }
        assert set(await listdir("/tmp")) <= code_under_tmp
        for hidden in ("/run", "/var/run", "/var", "/home"):
            with pytest.raises(SandboxError, match="FileNotFoundError"):
                await listdir(hidden)
    finally:
        server.close()
    assert accepted in ([], [None])


def _accept(server):
    try:
        connection, _ = server.accept()
        connection.sendall(b"HOST-SIDE-SERVER")
        return "connected"
    except OSError:
        return None


@pytest.mark.parametrize("fd", [1, 2])
async def test_an_output_flood_is_drained_capped_and_stopped(fd):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if fd == 1:
        with pytest.raises(SandboxError, match="the tool wrote more than 1 MiB of output and was stopped"):
            await run("flood", fd=1, megabytes=400)
    else:
        assert await run("flood", fd=2, megabytes=400) == "flooded"  # stderr: only its last 4 KiB is kept
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 100  # was +800 MB: the controller buffered all of it


async def test_a_flood_stopped_before_its_exit_is_seen_still_returns(monkeypatch):
    """The CI hang of 2026-11-24: asyncio's `Process.wait()` returns only once the pipes are closed, and a stdout
    nobody reads any more is paused with bytes left in it, so a wait that started before the child watcher had
    reported the kill never returned. Here the watcher reports every exit 0.5 s late, which makes that order
    certain; the call must still end with the output-cap error."""
    watcher_type = type(asyncio.get_child_watcher())
    if not hasattr(watcher_type, "_do_waitpid"):
        pytest.skip(f"{watcher_type.__name__} reports exits another way")
    reported_in_time = watcher_type._do_waitpid

    def report_late(self, *args):
        import time

        time.sleep(0.5)
        return reported_in_time(self, *args)

    monkeypatch.setattr(watcher_type, "_do_waitpid", report_late)
    with pytest.raises(SandboxError, match="the tool wrote more than 1 MiB of output and was stopped"):
        await asyncio.wait_for(run("flood", fd=1, megabytes=400), timeout=60)


@needs_cgroup
async def test_memory_is_capped_for_the_whole_sandbox():
    with pytest.raises(SandboxError, match=r"ran out of memory \(the sandbox's limit is 256 MB\)"):
        await run("memory_fanout", children=4, megabytes=200)  # 800 MB in 4 processes under memory_mb = 256


@needs_cgroup
async def test_processes_are_capped_for_the_whole_sandbox():
    result = await run("forks", count=200)
    started = int(result.split()[1].rstrip(","))
    assert started < LIMITS.max_processes + 4 and "Resource temporarily unavailable" in result


@needs_cgroup
async def test_a_fork_bomb_is_bounded_and_leaves_nothing_behind(created_cgroups):
    with pytest.raises(SandboxError, match="took longer than 3 s"):
        await run("fork_bomb", limits=SandboxLimits(timeout_s=3.0, cpu_s=10, max_processes=16))
    assert created_cgroups and _leftover(created_cgroups) == []


@pytest.fixture
def created_cgroups(monkeypatch):
    """The directories of the cgroups the sandbox creates during the test (other processes make their own)."""
    created = []

    class Recorded(cgroup.CallCgroup):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            created.extend(self.dirs)

    monkeypatch.setattr(cgroup, "CallCgroup", Recorded)
    return created


def _leftover(created):
    return [directory for directory in created if directory.exists()]


def _segments():
    return Path("/proc/sysvipc/shm").read_text().splitlines()[1:]


async def test_sysv_shared_memory_dies_with_the_call():
    before = _segments()
    assert (await run("sysv_shm", key=0x5EC19, megabytes=8)).startswith("segment")
    assert _segments() == before


async def test_devices_are_a_minimal_set():
    assert await listdir("/dev") == sorted(
        set(await listdir("/dev"))
        & {
            "null",
            "zero",
            "full",
            "random",
            "urandom",
            "tty",
            "shm",
            "pts",
            "ptmx",
            "fd",
            "stdin",
            "stdout",
            "stderr",
            "core",
            "console",
        }
    )
    with pytest.raises(SandboxError, match="FileNotFoundError"):
        await run("open_device", path="/dev/kvm")
    assert await run("open_device", path="/dev/null") == "opened /dev/null"


async def test_a_module_written_by_one_call_never_shadows_the_next():
    sandbox = Sandbox(LIMITS)
    assert await sandbox.run("tests.support.sandbox_payloads:write_module", {"name": "json"}) == "written"
    assert await sandbox.run("tests.support.sandbox_tools:add", {"a": 1, "b": 2}) == "3"
    path = json.loads(await sandbox.run("tests.support.sandbox_payloads:import_path", {}))
    assert "/tmp" not in path[:1] and "" not in path


async def test_secrets_data_and_other_rollouts_are_not_in_the_tree(tmp_path):
    secret = tmp_path / ".netrc"
    secret.write_text("machine api.wandb.ai password FAKE-SECRET")
    secret.chmod(0o600)
    with pytest.raises(SandboxError, match="FileNotFoundError"):
        await run("read_file", path=str(secret))
    home = Path.home()
    visible = await listdir("/")
    assert "home" not in visible and "var" not in visible and "etc" in visible
    if home != Path("/"):
        inside = await asyncio.gather(listdir(str(home)), return_exceptions=True)
        assert isinstance(inside[0], SandboxError) or set(inside[0]) <= {".pyenv", ".local", ".cache", ".venv"}
    # two rollouts' calls at once: neither sees the other's files
    writer = asyncio.ensure_future(run("write_and_wait", name="mine.txt", seconds=60))
    await written_by_a_call("mine.txt")
    assert "mine.txt" not in await listdir("/tmp")
    writer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await writer


async def test_scratch_has_a_quota():
    with pytest.raises(SandboxError, match="No space left on device"):
        await run("fill_disk", files=6, megabytes=16)  # 96 MB into a 32 MB scratch


@pytest.mark.parametrize("isolate", [True, False])
async def test_a_cancelled_call_leaves_no_scratch_process_or_cgroup(isolate, tmp_path, monkeypatch, created_cgroups):
    # where the sandbox would make host directories (the unshare root, isolate=False scratch)
    host_tmp = tmp_path / "host-tmp"
    host_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(host_tmp))
    call = asyncio.ensure_future(run("write_and_wait", isolate=isolate, name="big", seconds=60))
    await written_by_a_call("big")  # the call's scratch, processes and cgroup all exist
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert list(host_tmp.iterdir()) == []
    assert _leftover(created_cgroups) == []


@needs_cgroup
async def test_without_isolation_daemons_die_with_the_call():
    pid = int(await run("daemon", isolate=False, seconds=60))
    assert not _alive(pid)


def _alive(pid):
    try:
        state = Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


async def test_malformed_tool_output_is_a_tool_error():
    with pytest.raises(SandboxError, match="the tool's output is malformed"):
        await run("not_an_object")
    assert await run("surrogate") == "x ? y"
