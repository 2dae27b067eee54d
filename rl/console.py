"""The one channel for warnings and status lines to the user: `rlmesh: warning: ...` and `rlmesh: ...` on stderr.

Where a progress bar is live both go through `tqdm.write`, so the bar stays whole at the bottom of the terminal (a
plain `print` would cut it); in an actor process they land where that process's stderr goes (the run's `run.log`).
Product code warns through `warn`, never `print(..., file=sys.stderr)`, `warnings.warn` or a logger of its own
(tests/unit/rl/test_console.py checks the source); an error that ends a command goes through `fail`.
"""

from __future__ import annotations

import sys

PREFIX = "rlmesh: "
WARNING_PREFIX = "rlmesh: warning: "


def warn(message: str) -> None:
    """Tell the user about something that does not stop the run; `message` names what happened and why it matters."""
    _write(WARNING_PREFIX + message)


def say(line: str) -> None:
    """One status line (a phase starting, a replica replaced), so a long quiet stretch is not silent."""
    _write(PREFIX + line)


def fail(message: str, exit_code: int) -> int:
    """An error that ends a command: `rlmesh: message` on stderr; returns `exit_code` for the command to return."""
    _write(PREFIX + message)
    return exit_code


def _write(text: str) -> None:
    """Through `tqdm.write` while a progress bar is live in this process (it clears the bar, writes, redraws it), else
    straight to stderr: tqdm's first write makes its multiprocessing lock, which under the spawn start method starts a
    resource-tracker process (in an actor or a tool sandbox's runner, for one line)."""
    bars = sys.modules.get("tqdm.std")  # never imported here: the sandbox's runner imports this module on every call
    if bars is not None and bars.tqdm._instances:
        bars.tqdm.write(text, file=sys.stderr)
    else:
        sys.stderr.write(text + "\n")
    sys.stderr.flush()
