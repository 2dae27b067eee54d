"""The one channel for warnings: its format and stream, that a live progress bar survives it, and that no product
module writes warnings to the user another way (read from the source with `ast`)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from tqdm import tqdm

from rl.console import fail, say, warn

ROOT = Path(__file__).resolve().parents[3]
PRODUCT = ("actors", "rl", "tasks", "tools", "rubrics", "env_types", "rollouts")
CONSOLE = "rl/console.py"
# Modules that may still write to stderr themselves, and why; each must still do so (else drop it from here).
ALLOWED_STDERR = {
    "rl/processes/interrupts.py": "the Ctrl-C thread and the hard stop before os._exit: never wait on tqdm's lock",
}


def test_a_warning_and_a_status_line_go_to_stderr_with_the_prefix(capsys):
    warn("checkpoint step_00000002 skipped: trainer/ does not load")
    say("actors ready in 3 s")
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "rlmesh: warning: checkpoint step_00000002 skipped: trainer/ does not load\nrlmesh: actors ready in 3 s\n"
    )


def test_a_warning_under_a_live_progress_bar_gets_its_own_line_and_the_bar_is_redrawn(capsys):
    bar = tqdm(total=3, file=sys.stderr, disable=False, desc="train", mininterval=0)
    bar.update(1)
    warn("jsonl logging failed")
    bar.update(1)
    bar.close()
    err = capsys.readouterr().err
    shown = [line.rsplit("\r", 1)[-1] for line in err.split("\n")]  # what a terminal keeps of each line
    assert "rlmesh: warning: jsonl logging failed" in shown, repr(err)  # a plain print would append it to the bar
    assert "train:  67%" in err.split("rlmesh: warning:", 1)[1]  # the bar continues below it


def _is_stderr(node: ast.expr) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "stderr" and ast.unparse(node.value) == "sys"


def _writes(tree: ast.AST) -> list[tuple[int, str]]:
    """The calls that would reach the user outside the console module: to stderr, a stdlib warning, a module logger."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        called = ast.unparse(node.func)
        to_stderr = any(k.arg == "file" and _is_stderr(k.value) for k in node.keywords)
        if to_stderr or called in ("sys.stderr.write", "warnings.warn", "logging.warning"):
            found.append((node.lineno, called))
        elif called == "logging.getLogger" and not (node.args and isinstance(node.args[0], ast.Constant)):
            found.append((node.lineno, "a logger of its own"))  # a dependency's logger by name (to quiet it) is fine
    return found


def _warning_literals(tree: ast.AST) -> list[int]:
    """Lines where a call's first argument spells out 'rlmesh: warning:' itself instead of calling `warn`."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            first = node.args[0]
            parts = first.values if isinstance(first, ast.JoinedStr) else [first]
            if parts and isinstance(parts[0], ast.Constant) and str(parts[0].value).startswith("rlmesh: warning"):
                lines.append(node.lineno)
    return lines


def test_no_product_module_warns_the_user_but_through_the_console():
    stray, spelled, quiet = [], [], set(ALLOWED_STDERR)
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if name == CONSOLE:
                continue
            tree = ast.parse(path.read_text())
            spelled += [f"{name}:{line}" for line in _warning_literals(tree)]
            if writes := _writes(tree):
                if name in ALLOWED_STDERR:
                    quiet.discard(name)
                else:
                    stray += [f"{name}:{line}: {called}" for line, called in writes]
    assert not stray, "warn through rl.console (warn/say), not:\n" + "\n".join(stray)
    assert not spelled, "'rlmesh: warning:' spelled out instead of rl.console.warn:\n" + "\n".join(spelled)
    assert not quiet, f"allowed to write to stderr but no longer does (drop from ALLOWED_STDERR): {sorted(quiet)}"


@pytest.mark.processes
def test_a_line_without_a_bar_starts_no_process_and_imports_no_tqdm():
    """An actor or the tool sandbox's runner warns without a bar: tqdm's first write would make its multiprocessing
    lock, which under the spawn start method starts a resource-tracker process."""
    probe = (
        "import multiprocessing, os, subprocess, sys; multiprocessing.set_start_method('spawn')\n"
        "from rl.console import warn; warn('x')\n"
        "children = subprocess.run(['ps', '--ppid', str(os.getpid()), '-o', 'args='], capture_output=True, text=True)\n"
        "print([line for line in children.stdout.splitlines() if not line.startswith('ps ')], 'tqdm' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert done.stderr == "rlmesh: warning: x\n"
    assert done.stdout.strip() == "[] False"


def test_an_error_that_ends_a_command_goes_to_stderr_with_the_prefix_and_gives_its_exit_code(capsys):
    assert fail("cannot export: no checkpoint in runs/x", 2) == 2
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == ("", "rlmesh: cannot export: no checkpoint in runs/x\n")
