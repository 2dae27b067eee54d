"""Process titles: every actor process names its role in `ps` (`rlmesh: generator/0#1`, `rlmesh: trainer/0`).

Monarch starts every actor process as `python -m monarch._src.actor.bootstrap_main`; the title tells
an operator, `scripts/soak.py` and the chaos test which process is which role and replica.
"""

from __future__ import annotations

import setproctitle  # a dependency of vLLM's

PREFIX = "rlmesh: "


def name_process(role: str) -> None:
    """Title this process `rlmesh: <role>` (what `ps` and psutil's `cmdline()` show)."""
    setproctitle.setproctitle(f"{PREFIX}{role}")


def role_of(cmdline: list[str]) -> str | None:
    """The role a process titled by `name_process` has, from its command line; None for any other process."""
    title = " ".join(cmdline)
    return title.removeprefix(PREFIX).strip() if title.startswith(PREFIX) else None
