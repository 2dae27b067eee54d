"""Rank 0's rendezvous port (rl.processes.trainer_mesh.rendezvous_port)."""

import random
import socket

import pytest

from rl.processes.trainer_mesh import EPHEMERAL_PORTS, rendezvous_port


def test_the_rendezvous_port_is_free_and_below_the_ephemeral_range():
    """A port from the ephemeral range can be handed to any other process's bind(0) or connect before rank 0 listens
    (EADDRINUSE at the trainer's first start); one below it cannot."""
    low, _ = map(int, EPHEMERAL_PORTS.read_text().split())
    for _ in range(20):
        port = rendezvous_port()
        assert 1024 <= port < low
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
            listener.bind(("", port))  # free when returned


def test_a_taken_port_is_skipped(tmp_path):
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("40002\t60999\n")
    first = random.Random(0).sample(range(1024, 40002), 64)[0]  # the first candidate it tries
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("", first))
        taken.listen()
        port = rendezvous_port(ranges, random.Random(0))
    assert port != first and 1024 <= port < 40002


def test_no_room_below_the_range_is_a_clear_error(tmp_path):
    ranges = tmp_path / "ip_local_port_range"
    ranges.write_text("1024 60999")
    with pytest.raises(RuntimeError, match="no free TCP port"):
        rendezvous_port(ranges)
