"""Tool functions that misbehave, for the sandbox tests (they run inside the sandbox)."""

import os
import socket


def add(a: int, b: int) -> str:
    return str(a + b)


def loop_forever() -> str:
    while True:
        pass


def sleep_forever() -> str:
    import time

    time.sleep(3600)
    return "woke"


def allocate(megabytes: int) -> str:
    blocks = [bytearray(1 << 20) for _ in range(megabytes)]
    return str(len(blocks))


def open_socket(host: str, port: int) -> str:
    with socket.create_connection((host, port), timeout=2):
        return "connected"


def bind_socket() -> str:
    with socket.socket() as server:
        server.bind(("0.0.0.0", 0))
        return "bound"


def write_file(path: str) -> str:
    with open(path, "w") as handle:
        handle.write("x")
    return f"wrote {path}"


def read_scratch(name: str) -> str:
    with open(name) as handle:
        return handle.read()


def kill_parent(pid: int) -> str:
    os.kill(pid, 0)
    return "could signal"


def prints() -> None:
    print("hello from the tool")
