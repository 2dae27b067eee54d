"""The sandbox's interpreter path: a venv reached through a symbolic link still runs tools; the
warning a sandbox without isolation gives."""

import os
import sys

import pytest

from tools.sandbox import Sandbox, SandboxLimits, namespaces_available
from tools.sandbox.command import interpreter

LIMITS = SandboxLimits(timeout_s=120.0, cpu_s=10, memory_mb=512)


def symlinked_interpreter(tmp_path) -> str:
    """sys.executable as seen through a link to this venv's (resolved) prefix."""
    link = tmp_path / "venv-link"
    link.symlink_to(os.path.realpath(sys.prefix), target_is_directory=True)
    relative = os.path.relpath(sys.executable, sys.prefix)
    assert not relative.startswith(".."), "sys.executable lies under sys.prefix in a venv"
    return str(link / relative)


def test_interpreter_resolves_the_directory_but_keeps_the_venv_entry(tmp_path, monkeypatch):
    executable = symlinked_interpreter(tmp_path)
    monkeypatch.setattr(sys, "executable", executable)
    expected = os.path.join(os.path.realpath(sys.prefix), os.path.relpath(executable, tmp_path / "venv-link"))
    assert interpreter() == expected
    assert os.path.islink(executable) == os.path.islink(expected)  # venv/bin/python itself is not resolved


@pytest.mark.processes
@pytest.mark.skipif(not namespaces_available(), reason="no unprivileged user namespaces here")
async def test_tool_runs_when_the_venv_is_reached_through_a_symlink(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", symlinked_interpreter(tmp_path))
    result = await Sandbox(LIMITS).run("tests.support.sandbox_tools:add", {"a": 2, "b": 3})
    assert result == "5"
