"""The run's log file, `RUN_DIR/run.log`: where dependency noise goes instead of the console.

Python warnings of the controller (FutureWarnings and the like) and everything the actor
processes write to stderr (vLLM's start-up notes, torch's NUMA binding note, loading bars,
deprecation warnings) land in the file; the console keeps the progress bar, the per-step
lines and the sample logs. An actor that fails is still reported on the console by the
controller (Monarch's supervision carries its traceback).

The actor processes must be redirected before they import vLLM, i.e. before the run
directory exists, so the file starts as a hidden file in `run.output_dir` (named to the
actors by `RLMESH_LOG_FILE`), gets a second name (a hard link) in the run directory once it
is made, and loses the hidden name when the run ends: an actor process that opens the file
late still writes into the same one.
"""

from __future__ import annotations

import os
import tempfile
import warnings
from pathlib import Path
from typing import TextIO

LOG_FILE_ENV = "RLMESH_LOG_FILE"
OWNER_ENV = "RLMESH_LOG_OWNER_PID"


class RunLog:
    def __init__(self, output_dir: str | Path):
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".rlmesh-", suffix=".log", dir=output_dir)
        os.chmod(name, 0o644)
        self.path = Path(name)
        os.close(fd)
        self.file: TextIO = open(name, "a", buffering=1)  # O_APPEND: the actors write to the same file
        os.environ[LOG_FILE_ENV], os.environ[OWNER_ENV] = name, str(os.getpid())
        self._showwarning = warnings.showwarning
        warnings.showwarning = self._write_warning

    def _write_warning(self, message, category, filename, lineno, file=None, line=None) -> None:
        self.file.write(warnings.formatwarning(message, category, filename, lineno, line))

    def move_into(self, run_dir: Path) -> None:
        """Name the file `run_dir/run.log` (`run.1.log`, ... when a resumed run has one already)."""
        target, index = run_dir / "run.log", 0
        while target.exists():
            index += 1
            target = run_dir / f"run.{index}.log"
        os.link(self.path, target)

    def close(self) -> None:
        warnings.showwarning = self._showwarning
        os.environ.pop(LOG_FILE_ENV, None)
        os.environ.pop(OWNER_ENV, None)
        self.file.close()
        self.path.unlink(missing_ok=True)


def redirect_actor_process() -> None:
    """In an actor process of a run: stderr (fd 2, so C++ notes too) and Python warnings into the run's log."""
    path = os.environ.get(LOG_FILE_ENV)
    if not path or os.environ.get(OWNER_ENV) == str(os.getpid()):
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
