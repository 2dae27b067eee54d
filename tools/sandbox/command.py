"""The command line of one sandboxed call: the namespace backend found on this machine (bubblewrap, or `unshare`
with `unshare_setup.sh`), the read-only tree bound into the sandbox, and the runner's interpreter."""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tools import cgroup
from tools.sandbox.limits import SandboxLimits

SCRATCH = "/tmp"
"""The call's scratch directory inside the sandbox: its working directory, `HOME` and `TMPDIR`."""
UNSHARE_SETUP = (Path(__file__).with_name("unshare_setup.sh")).read_text()
"""The shell program that builds the tree inside `unshare`'s namespaces (where bwrap is missing)."""
ENTER_CGROUP = 'for procs in $RLMESH_CGROUP_PROCS; do echo $$ > "$procs"; done; exec "$@"'
"""Enters the call's cgroup before anything else starts, so every process of the call is in it."""


def namespaces_available() -> bool:
    """Whether unprivileged user, network, PID, mount, IPC and UTS namespaces work on this machine."""
    return backend() is not None


@functools.cache
def backend() -> str | None:
    """`bwrap` when it is installed and works here, else `unshare` (same tree, built by `unshare_setup.sh`) when
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
def tree(fn_module: str) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
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


def interpreter() -> str:
    """This interpreter's path with its directory resolved: the sandbox binds only resolved paths, so a venv
    reached through a symbolic link (`/opt/env -> /data/venv`) is not there under the link's name. The last
    component stays as it is: `venv/bin/python` (itself a link to the base interpreter) is how Python finds
    the venv's `pyvenv.cfg` and site-packages."""
    return os.path.join(os.path.realpath(os.path.dirname(sys.executable)), os.path.basename(sys.executable))


def build_command(
    fn_path: str, limits: SandboxLimits, isolate: bool, group: cgroup.CallCgroup | None, host_dirs: list[str]
) -> tuple[list[str], dict[str, str], str]:
    """(argv, environment, working directory) of one call of `fn_path`; host directories it makes (to remove
    when the call ends) are appended to `host_dirs`."""
    runner = [interpreter(), "-P", "-s", "-m", "tools.sandbox.child"]  # -P: no script directory or cwd on sys.path
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
    if isolate:
        env.update(HOME=SCRATCH, TMPDIR=SCRATCH)
        binds, links = tree(fn_path.partition(":")[0])
        if backend() == "bwrap":
            scratch = str(limits.scratch_mb << 20)
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
                SCRATCH,
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
                SCRATCH,
                "--",
                *runner,
            ]
        else:
            root = tempfile.mkdtemp(prefix="rlmesh-sandbox-root-")  # an empty mount point, never written on the host
            host_dirs.append(root)
            env.update(
                RLMESH_ROOT=root,
                RLMESH_BINDS="\n".join(binds),
                RLMESH_SCRATCH_BYTES=str(limits.scratch_mb << 20),
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
                UNSHARE_SETUP,
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
        command = ["sh", "-c", ENTER_CGROUP, "sandbox-cgroup", *command]
    return command, env, cwd
