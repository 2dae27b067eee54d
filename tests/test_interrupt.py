"""Ctrl-C on a real run stops every actor process (no orphans) and exits with 130."""

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parent.parent


def processes_with_marker(marker: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter():
        try:
            if process.environ().get("RLMESH_TEST_MARKER") == marker:
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def test_ctrl_c_stops_all_actor_processes(tmp_path):
    marker = uuid.uuid4().hex
    env = {**os.environ, "RLMESH_TEST_MARKER": marker, "PYTHONUNBUFFERED": "1"}
    launcher = subprocess.Popen(
        [sys.executable, "-m", "rl.cli", "train", "--config", str(REPO / "configs" / "tiny_qwen3_e2e.toml"),
         "--run.output_dir", str(tmp_path), "--run.steps", "50", "--wandb.enabled", "false"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    output = []
    for line in launcher.stdout:
        output.append(line)
        if "step    1 v1" in line:
            break
    assert launcher.poll() is None, "".join(output[-30:])
    assert len(processes_with_marker(marker)) >= 4  # launcher + trainer + generator + reward (+ store)
    launcher.send_signal(signal.SIGINT)
    rest, _ = launcher.communicate(timeout=120)
    assert launcher.returncode == 130, "".join(output[-20:]) + rest[-3000:]
    assert "interrupted; actors stopped" in rest
    deadline = time.monotonic() + 10
    while processes_with_marker(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_with_marker(marker) == []
