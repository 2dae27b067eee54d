"""Process names: every actor process names its role in the kernel's `comm` (`generator/0#1`, `trainer/0`).

Every actor process starts as `python -m rl.processes.bootstrap` (Monarch's entry); the name tells an
operator (`ps -o comm`, `top`), `benchmarks/soak.py` and the chaos test which process is which role and replica.
The command line and environment stay as they are (teardown finds actor processes by their command line,
tests by an environment marker), so the name goes only into the main thread's `comm`: at most 15 bytes,
longer roles are cut (`frozen_judge/0#0` reads `frozen_judge/0#`).
"""

from __future__ import annotations

import os
from pathlib import Path

COMM_BYTES = 15


def name_process(role: str) -> None:
    """Name this process `role` (cut to 15 bytes) in `/proc/<pid>/comm`, from whichever thread runs this."""
    Path(f"/proc/self/task/{os.getpid()}/comm").write_bytes(role.encode()[:COMM_BYTES])


def role_of(pid: int) -> str:
    """The name of process `pid` (`name_process`'s role, or e.g. `python` for a process that set none)."""
    return Path(f"/proc/{pid}/comm").read_text().strip()
