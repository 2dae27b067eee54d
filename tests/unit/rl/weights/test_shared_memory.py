"""The weight files' room in /dev/shm: a run is refused at validation when its sync cannot fit (Docker's 64 MB
default), and a file that cannot get its bytes fails with ENOSPC, not SIGBUS at the first write.

Each test runs in a private mount namespace with a real 64 MB tmpfs on /dev/shm, as `docker run` gives.
"""

import shutil
import subprocess
import sys

import pytest
import torch

from rl.config import load_config
from rl.loop.resolve import resolve_config
from rl.weights.sync import parameter_bytes, shared_memory_needed
from tests.support.paths import CONFIGS, REPO, TINY

pytestmark = pytest.mark.processes  # validation and a weight file in child processes


def _in_a_64mb_shm(python: str) -> subprocess.CompletedProcess:
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux) to mount a private 64 MB /dev/shm")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no private mount namespace here: {probe.stderr.decode().strip()}")
    script = f'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec {sys.executable} -c "$0"'
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", script, python],
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_bytes_a_sync_needs_are_the_policys_in_the_wire_dtype():
    fp32 = resolve_config(load_config(CONFIGS / "sum_digits_smollm2_cpu.toml"))
    count = parameter_bytes("smollm2-135m-instruct", torch.float32) // 4
    assert 134_000_000 < count < 135_000_000  # SmolLM2-135M, tied embeddings counted once
    assert shared_memory_needed(fp32) == 2 * 4 * count  # two slots (versions alternate), fp32
    staging = resolve_config(load_config(TINY, {"weight_sync.transport": "torchstore", "generator.num_replicas": "2"}))
    assert shared_memory_needed(staging) == 2 * parameter_bytes("tiny-qwen3", torch.float32)  # a file per generator
    bf16 = resolve_config(load_config(TINY, {"generator.dtype": "bfloat16", "generator.num_replicas": "2"}))
    size = parameter_bytes("tiny-qwen3", torch.bfloat16)
    assert shared_memory_needed(bf16) == 2 * size + 2 * size  # two slots, and each generator's resident copy (deltas)
    never = resolve_config(
        load_config(TINY, {"generator.dtype": "bfloat16", "generator.num_replicas": "2", "weight_sync.delta": "never"})
    )
    assert shared_memory_needed(never) == 2 * size


def test_a_run_whose_sync_does_not_fit_in_dev_shm_is_refused_at_validation():
    done = _in_a_64mb_shm(
        "import sys; from rl.commands.cli import main; sys.exit(main(['validate', '--config', 'configs/sum_digits_smollm2_cpu.toml']))"
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "weight sync needs 1026 MiB in /dev/shm" in done.stderr and "only 64 MiB free" in done.stderr, done.stderr


def test_a_weight_file_that_does_not_fit_fails_with_enospc_not_sigbus():
    done = _in_a_64mb_shm(
        "from rl.weights.shared_file import map_file\n"
        "try:\n"
        "    map_file('/dev/shm/rlmesh-weights-test', 100 * 2**20, create=True)\n"
        "except OSError as exc:\n"
        "    print('refused', exc.errno, exc)\n"
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # SIGBUS would be -7
    assert "refused 28 " in done.stdout and "cannot reserve 100 MiB" in done.stdout, done.stdout
