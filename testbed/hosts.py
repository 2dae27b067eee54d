"""Namespaced "hosts" on this machine: each its own network stack, hostname, /tmp, /dev/shm and /etc/hosts.

`hosts(["launcher", "trainer0", ...], keep=[...])` (a context manager) builds, and always tears down:

- a **switch**: a network namespace holding a Linux bridge and nothing else, so the hosts' subnet (`SUBNET`) exists
  only there: the machine's own namespace gets no interface, route or address, and two networks built at once
  (another test, another helper) cannot collide;
- per **host**, a network namespace (`ip netns`) joined to the bridge by a veth pair (`eth0` inside, an address of
  `SUBNET`, its own loopback), and an *anchor* process (`sleep`) started in it under `unshare --uts --mount --ipc
  --propagation private` that sets up, in its new namespaces: the hostname; a tmpfs on /dev/shm; a tmpfs on /tmp,
  with every `keep` path that lies under /tmp bound back at the same path (the machine's /tmp is first bound aside,
  the tmpfs mounted, the kept paths bound back from the aside copy, the aside copy unmounted), so a CI clone under
  /tmp/..., its venv, the model cache and a test's run directory stay visible while everything else in /tmp is the
  host's own; a tmpfs on each of `private_dirs`; and /etc/hosts bind-mounted from a file naming every host at its
  address (a host's own name resolves to its `eth0` address, never to loopback). Mounts are private, so nothing
  propagates back to the machine.

`Host.popen` runs a command in a host: `nsenter` into the anchor's network, UTS, mount and IPC namespaces (it execs,
so the Popen's pid is the command's, in the machine's pid namespace: psutil and kill work as usual). `Host.pids`
lists every process of a host (those in its network namespace), `Host.kill_all` kills them (the anchor stays, so
the host can run commands again), `Host.link_down` / `link_up` detach the host's cable from the bridge and
attach it again: its own interface stays up while every packet to and from it is dropped silently, as when a
switch port or the network between hosts fails; and `Host.block_new_connections` drops new connections into a host
while the open ones go on (an nftables rule on SYNs in its network namespace; `firewall_unavailable()` says when `nft` is
missing).

Bounded and cleaned up: at most `MAX_HOSTS` hosts, tmpfs sizes capped; on exit every process in the hosts is
killed and the namespaces and files removed. The anchors die with the process that made them (PR_SET_PDEATHSIG),
and namespaces left by an earlier run that was killed (their names carry the owner's pid and start time) are removed
when a new network is built. Needs root, iproute2's `ip` and util-linux's `unshare`, `nsenter` and `mount`:
`unavailable()` says why not, for a skip.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil

SUBNET = "10.231.0"  # /24, the hosts at .1, .2, ... in the order named; it exists only inside the switch namespace
PREFIX = "rlmh-"  # every namespace this module makes: rlmh-<owner pid>-<owner start time>-<serial>-<host index|sw>
STATE = Path("/run/rlmesh-hosts")  # per network: the /etc/hosts file and the mount points /tmp is bound aside to
MAX_HOSTS = 16
TOOLS = ("ip", "unshare", "nsenter", "mount", "sleep", "sh")
READY = "ready"
UNSHARE = ["unshare", "--uts", "--mount", "--ipc", "--propagation", "private", "--"]
_serial = iter(range(1 << 30))


def unavailable() -> str | None:
    """Why namespaced hosts cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "namespaced hosts need root (network, mount and UTS namespaces)"
    missing = [tool for tool in TOOLS if shutil.which(tool) is None]
    if missing:
        return f"namespaced hosts need {', '.join(missing)} (iproute2, util-linux)"
    probe = f"{_token()}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    if made.returncode != 0:
        return f"cannot make a network namespace: {made.stderr.strip()}"
    return None


def _token() -> str:
    """A fresh name stem: PREFIX<this process's pid>-<its start time>-<serial> (see `remove_stale`)."""
    return f"{PREFIX}{os.getpid()}-{int(psutil.Process().create_time())}-{next(_serial)}"


def firewall_unavailable() -> str | None:
    """Why `Host.block_new_connections` cannot work here (None: it can)."""
    return (
        None
        if shutil.which("nft")
        else "blocking connections needs nftables' `nft` (scripts/setup_env.sh installs it as root)"
    )


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _netns_inode(name: str) -> int:
    return os.stat(f"/run/netns/{name}").st_ino


def _processes_in_netns(inode: int) -> list[int]:
    """Pids of the processes whose network namespace is `inode`."""
    pids = []
    for pid in psutil.pids():
        try:
            if os.stat(f"/proc/{pid}/ns/net").st_ino == inode:
                pids.append(pid)
        except OSError:  # gone, or a kernel thread
            pass
    return pids


def _kill_and_reap(pids: Iterable[int]) -> None:
    processes = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            process.kill()
            processes.append(process)
        except psutil.Error:
            pass
    psutil.wait_procs(processes, timeout=10)


def _owner_alive(name: str) -> bool:
    """Whether the process that made namespace `name` (PREFIX<pid>-<start time>-...) is still running."""
    try:
        pid, started = (int(part) for part in name[len(PREFIX) :].split("-")[:2])
        return int(psutil.Process(pid).create_time()) == started
    except (ValueError, psutil.Error):
        return False


def remove_stale() -> list[str]:
    """Remove the namespaces (and kill their processes) and state left by networks whose owner is gone; their names."""
    present = sorted(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else []
    stale = [name for name in present if name.startswith(PREFIX) and not _owner_alive(name)]
    for name in stale:
        with contextlib.suppress(OSError):
            _kill_and_reap(_processes_in_netns(_netns_inode(name)))
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    if STATE.is_dir():
        for directory in STATE.iterdir():
            if not _owner_alive(PREFIX + directory.name):
                shutil.rmtree(directory, ignore_errors=True)
    return stale


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@dataclass
class Host:
    """One namespaced host: `name` is its hostname, `ip` its address on the hosts' subnet."""

    name: str
    ip: str
    netns: str
    switch: str
    port: str  # the switch-side end of its veth pair
    anchor: subprocess.Popen
    started: list[subprocess.Popen] = field(default_factory=list)

    def popen(self, args: Sequence[str], cwd: str | os.PathLike | None = None, **kwargs) -> subprocess.Popen:
        """Start `args` in this host (its network, hostname, mounts and IPC), in `cwd` (default: this process's)."""
        enter = ["nsenter", f"--target={self.anchor.pid}", "--net", "--uts", "--mount", "--ipc"]
        enter.append(f"--wd={os.fspath(cwd) if cwd is not None else os.getcwd()}")
        process = subprocess.Popen([*enter, "--", *args], **kwargs)
        self.started.append(process)
        return process

    def run(
        self, args: Sequence[str], timeout: float = 60, cwd: str | os.PathLike | None = None
    ) -> subprocess.CompletedProcess:
        """Run `args` in this host to completion, its output captured as text."""
        process = self.popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)

    def pids(self) -> list[int]:
        """Every process running in this host but its anchor."""
        return [pid for pid in _processes_in_netns(_netns_inode(self.netns)) if pid != self.anchor.pid]

    def kill_all(self) -> list[int]:
        """SIGKILL every process of this host (as if it lost power; the anchor stays); the pids killed."""
        pids = self.pids()
        _kill_and_reap(pids)
        for process in self.started:
            if process.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=5)
        return pids

    def link_down(self) -> None:
        """Cut this host off the network: its packets, both ways, are dropped at the switch without a word."""
        _ip("-n", self.switch, "link", "set", self.port, "nomaster")

    def link_up(self) -> None:
        _ip("-n", self.switch, "link", "set", self.port, "master", "br0")

    def block_new_connections(self) -> None:
        """Drop every new TCP connection into this host from the network (its SYNs, by an nftables rule in its network
        namespace: no connection tracking, which would take the open connections it meets for new ones); those already
        open go on."""
        self._nft(
            "table inet rlmesh_hosts {\n chain input {\n type filter hook input priority 0; policy accept;\n"
            ' iifname "eth0" tcp flags & (syn | ack) == syn drop\n }\n}\n'
        )

    def allow_new_connections(self) -> None:
        self._nft("delete table inet rlmesh_hosts\n")

    def _nft(self, rules: str) -> None:
        enter = ["nsenter", f"--net=/run/netns/{self.netns}", "--"]
        done = subprocess.run([*enter, "nft", "-f", "-"], input=rules, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"nft: {done.stderr.strip()}")


class Network:
    """The hosts of one `hosts(...)` block, by name."""

    def __init__(self, hosts: dict[str, Host], state: Path):
        self.hosts = hosts
        self.state = state

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def __iter__(self) -> Iterator[Host]:
        return iter(self.hosts.values())


def _anchor_script(name: str, state: Path, keep: list[Path], private_dirs: list[Path], tmpfs_size: str) -> str:
    """The shell commands the anchor runs in its fresh UTS, mount and IPC namespaces before it sleeps."""
    aside = state / f"aside-{name}"
    lines = [
        "set -e",
        f"echo {shlex.quote(name)} > /proc/sys/kernel/hostname",
        f"mount --rbind /tmp {aside}",
        f"mount -t tmpfs -o size={tmpfs_size},mode=1777 tmpfs /tmp",
    ]
    for path in keep:
        inside = aside / path.relative_to("/tmp")
        make = f"mkdir -p {shlex.quote(str(path))}" if path.is_dir() else f"mkdir -p {shlex.quote(str(path.parent))}"
        touch = "" if path.is_dir() else f" && touch {shlex.quote(str(path))}"
        lines += [make + touch, f"mount --rbind {shlex.quote(str(inside))} {shlex.quote(str(path))}"]
    lines += [
        f"umount -l {aside}",
        f"mount -t tmpfs -o size={tmpfs_size},mode=1777 tmpfs /dev/shm",
        *(f"mount -t tmpfs -o size={tmpfs_size} tmpfs {shlex.quote(str(d))}" for d in private_dirs),
        f"mount --bind {state / 'hosts'} /etc/hosts",
        "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6 || true",
        f"echo {READY}",
        "exec sleep infinity",
    ]
    return "\n".join(lines)


@contextlib.contextmanager
def hosts(
    names: Sequence[str],
    keep: Iterable[str | os.PathLike] = (),
    private_dirs: Iterable[str | os.PathLike] = (),
    tmpfs_size: str = "2g",
) -> Iterator[Network]:
    """Namespaced hosts named `names` (see the module docstring), torn down on exit.

    `keep`: paths that must stay visible at the same path in every host although they lie under /tmp (the repository,
    the venv, the model cache, a run directory); paths elsewhere are visible anyway. A missing one is made a directory.
    `private_dirs`: directories that get an empty tmpfs of their own in each host (e.g. a daemon's spool).
    """
    if not 0 < len(names) <= MAX_HOSTS or len(set(names)) != len(names):
        raise ValueError(f"hosts: 1 to {MAX_HOSTS} distinct names, got {list(names)}")
    reason = unavailable()
    if reason:
        raise RuntimeError(reason)
    remove_stale()
    kept = []
    for path in map(Path, keep):
        path = path.resolve()
        if path == Path("/tmp") or Path("/tmp") in path.parents:
            if path == Path("/tmp"):
                raise ValueError("hosts: /tmp itself cannot be kept (each host has its own)")
            if not path.exists():
                path.mkdir(parents=True)
            kept.append(path)
    private = [Path(d).resolve() for d in private_dirs]
    for directory in private:
        directory.mkdir(parents=True, exist_ok=True)
    token = _token()
    switch = f"{token}-sw"
    state = STATE / token[len(PREFIX) :]
    made: list[str] = []
    network = Network({}, state)
    try:
        state.mkdir(parents=True)
        addresses = {name: f"{SUBNET}.{index + 1}" for index, name in enumerate(names)}
        lines = ["127.0.0.1 localhost", *(f"{ip} {name}" for name, ip in addresses.items())]
        (state / "hosts").write_text("\n".join(lines) + "\n")
        _ip("netns", "add", switch)
        made.append(switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for index, name in enumerate(names):
            netns, port = f"{token}-{index}", f"h{index}"
            _ip("netns", "add", netns)
            made.append(netns)
            _ip("-n", switch, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", netns)
            _ip("-n", switch, "link", "set", port, "master", "br0", "up")
            _ip("-n", netns, "addr", "add", f"{addresses[name]}/24", "dev", "eth0")
            _ip("-n", netns, "link", "set", "eth0", "up")
            _ip("-n", netns, "link", "set", "lo", "up")
            (state / f"aside-{name}").mkdir()
            script = _anchor_script(name, state, kept, private, tmpfs_size)
            anchor = subprocess.Popen(
                ["nsenter", f"--net=/run/netns/{netns}", "--", *UNSHARE, "sh", "-c", script],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                preexec_fn=_die_with_parent,
            )
            host = Host(name, addresses[name], netns, switch, port, anchor)
            network.hosts[name] = host
            line = anchor.stdout.readline().strip()
            if line != READY:
                anchor.kill()
                raise RuntimeError(f"host {name}: set-up failed: {line} {anchor.stderr.read().strip()}")
            anchor.stdout.close()
        yield network
    finally:
        for host in network:
            with contextlib.suppress(OSError):
                _kill_and_reap(_processes_in_netns(_netns_inode(host.netns)))
            for process in host.started:  # one started a moment ago may still be nsenter, not yet in the namespace
                if process.poll() is None:
                    process.kill()
            for process in [*host.started, host.anchor]:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=10)
                for stream in (process.stdout, process.stderr, process.stdin):
                    if stream is not None:
                        stream.close()
        for netns in reversed(made):
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        shutil.rmtree(state, ignore_errors=True)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    """Poll `predicate` until it returns something truthy (returned), or raise after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:g} s")
        time.sleep(interval)
