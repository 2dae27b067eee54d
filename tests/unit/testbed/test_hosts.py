"""testbed/hosts.py: namespaced hosts see their own hostname, /tmp, /dev/shm and loopback, resolve and reach each
other over TCP by name, lose each other when a link is down, and leave nothing behind."""

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from testbed import hosts as namespaced
from tests.support.paths import REPO

REASON = namespaced.unavailable()
pytestmark = [pytest.mark.processes, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

SERVE = """
import socket, sys
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
while True:
    connection, _ = server.accept()
    connection.sendall(socket.gethostname().encode())
    connection.close()
"""
ASK = """
import socket, sys
try:
    with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as connection:
        print(connection.recv(100).decode())
except OSError as error:
    print(type(error).__name__)
"""


def serve(host, address, port):
    server = host.popen([sys.executable, "-c", SERVE, address, str(port)], stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "listening"
    return server


def ask(host, address, port, timeout=2.0) -> str:
    done = host.run([sys.executable, "-c", ASK, address, str(port), str(timeout)])
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.fixture(scope="module")
def network(tmp_path_factory):
    kept = tmp_path_factory.mktemp("kept")
    with namespaced.hosts(["alpha", "beta"], keep=[kept, REPO, Path(sys.prefix)]) as made:  # a clone under /tmp
        made.kept = kept
        yield made


def test_each_host_has_its_name_and_resolves_the_others_to_their_addresses(network):
    code = "import socket; print(socket.gethostname(), socket.gethostbyname('alpha'), socket.gethostbyname('beta'))"
    for host in network:
        done = host.run([sys.executable, "-c", code])
        assert done.stdout.split() == [host.name, network["alpha"].ip, network["beta"].ip], done.stderr


def test_hosts_reach_each_other_over_tcp_by_name_and_their_loopbacks_are_private(network):
    alpha, beta = network["alpha"], network["beta"]
    server = serve(alpha, "0.0.0.0", 7001)
    try:
        assert ask(beta, "alpha", 7001) == "alpha"
        assert ask(alpha, "127.0.0.1", 7001) == "alpha"  # alpha's own loopback
        assert ask(beta, "127.0.0.1", 7001) == "ConnectionRefusedError"  # beta's loopback is its own
    finally:
        server.kill()


def test_tmp_and_dev_shm_are_each_hosts_own_but_kept_paths_are_shared(network):
    alpha, beta = network["alpha"], network["beta"]
    name = f"rlmesh-hosts-test-{os.getpid()}"
    for directory in ("/tmp", "/dev/shm"):
        assert alpha.run(["sh", "-c", f"echo alpha > {directory}/{name}"]).returncode == 0
        assert beta.run(["cat", f"{directory}/{name}"]).returncode != 0  # not in beta's
        assert not os.path.exists(f"{directory}/{name}")  # nor in the machine's
        assert alpha.run(["cat", f"{directory}/{name}"]).stdout == "alpha\n"
    assert str(network.kept).startswith("/tmp/")
    assert alpha.run(["sh", "-c", f"echo shared > {network.kept}/{name}"]).returncode == 0
    assert beta.run(["cat", f"{network.kept}/{name}"]).stdout == "shared\n"
    assert (network.kept / name).read_text() == "shared\n"
    # the venv and the repo
    assert beta.run([sys.executable, "-c", "import rl.commands.cli"], cwd=network.kept).returncode == 0


def test_a_link_down_drops_the_hosts_traffic_until_it_is_up_again(network):
    alpha, beta = network["alpha"], network["beta"]
    server = serve(beta, "0.0.0.0", 7002)
    try:
        beta.link_down()
        try:
            started = time.monotonic()
            assert ask(alpha, "beta", 7002, timeout=1.0) == "TimeoutError"  # silence, not a refusal
            assert time.monotonic() - started >= 1.0
        finally:
            beta.link_up()
        assert ask(alpha, "beta", 7002) == "beta"
    finally:
        server.kill()


ECHO = """
import socket, sys, threading
server = socket.create_server(("0.0.0.0", int(sys.argv[1])))
print("listening", flush=True)
def echo(connection):
    with connection:
        while data := connection.recv(100):
            connection.sendall(data)
while True:
    threading.Thread(target=echo, args=(server.accept()[0],), daemon=True).start()
"""
TALK = """
import socket, sys
opened = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2)
print("open", flush=True)
for line in sys.stdin:
    opened.sendall(line.encode())
    print(opened.recv(100).decode().strip(), flush=True)
"""


def connect(host, address, port) -> str:
    """Whether `host` can open a TCP connection to `address`:`port` within a second ("connected", else the error)."""
    code = "import socket, sys\ntry:\n    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1)\n"
    code += "    print('connected')\nexcept OSError as error:\n    print(type(error).__name__)"
    return host.run([sys.executable, "-c", code, address, str(port)]).stdout.strip()


@pytest.mark.skipif(namespaced.firewall_unavailable() is not None, reason=namespaced.firewall_unavailable() or "")
def test_blocked_new_connections_into_a_host_leave_the_open_ones_working(network):
    alpha, beta = network["alpha"], network["beta"]
    server = beta.popen([sys.executable, "-c", ECHO, "7003"], stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "listening"
    talk = alpha.popen(
        [sys.executable, "-c", TALK, "beta", "7003"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert talk.stdout.readline().strip() == "open"
        beta.block_new_connections()
        try:
            assert connect(alpha, "beta", 7003) == "TimeoutError"  # a new connection gets no answer
            talk.stdin.write("still here\n")
            talk.stdin.flush()
            assert talk.stdout.readline().strip() == "still here"  # the open one goes on
            assert connect(beta, "127.0.0.1", 7003) == "connected"  # beta's own loopback is not filtered
        finally:
            beta.allow_new_connections()
        assert connect(alpha, "beta", 7003) == "connected"
    finally:
        talk.kill()
        server.kill()


def test_kill_all_kills_every_process_of_a_host_and_it_can_run_again(network):
    alpha, beta = network["alpha"], network["beta"]
    sleeper = alpha.popen(["sh", "-c", "sleep 600 & sleep 600"])
    other = beta.popen(["sleep", "600"])
    try:
        namespaced.wait_for(lambda: len(alpha.pids()) >= 3, 10, "alpha's processes")
        killed = alpha.kill_all()
        assert sleeper.pid in killed and len(killed) >= 3
        assert sleeper.poll() is not None and alpha.pids() == [] and other.poll() is None
        assert alpha.run(["hostname"]).stdout.strip() == "alpha"
    finally:
        other.kill()
        other.wait()


def test_the_network_leaves_no_namespace_process_or_file_behind():
    with namespaced.hosts(["solo"]) as made:
        solo = made["solo"]
        sleeper = solo.popen(["sleep", "600"])
        names = [solo.netns, solo.switch]
        assert all(os.path.exists(f"/run/netns/{name}") for name in names)
        state, anchor = made.state, solo.anchor.pid
    assert not any(os.path.exists(f"/run/netns/{name}") for name in names)
    sleeper.wait(timeout=10)  # killed with the host; under load it may not have exited the moment the network is gone
    assert not psutil.pid_exists(anchor) and not state.exists()


def test_namespaces_left_by_a_killed_run_are_removed_with_their_processes():
    stale = f"{namespaced.PREFIX}{os.getpid()}-1-0-0"  # this pid but another start time: its owner is gone
    subprocess.run(["ip", "netns", "add", stale], check=True)
    orphan = subprocess.Popen(["nsenter", f"--net=/run/netns/{stale}", "--", "sleep", "600"])
    namespaced.wait_for(
        lambda: os.stat(f"/proc/{orphan.pid}/ns/net").st_ino == os.stat(f"/run/netns/{stale}").st_ino, 10, "the orphan"
    )
    assert stale in namespaced.remove_stale()
    orphan.wait(timeout=10)  # reaped by remove_stale, which killed it
    assert not psutil.pid_exists(orphan.pid) and not os.path.exists(f"/run/netns/{stale}")
