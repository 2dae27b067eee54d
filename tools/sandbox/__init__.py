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

from tools.sandbox.command import namespaces_available
from tools.sandbox.host import Sandbox
from tools.sandbox.limits import MAX_OUTPUT_BYTES, SandboxError, SandboxLimits

__all__ = ["MAX_OUTPUT_BYTES", "Sandbox", "SandboxError", "SandboxLimits", "namespaces_available"]
