"""Two hosts whose workers already run (`rlmesh worker --address tcp://...`), attached over TCP (`scheduler =
"attach"`): a 2-rank trainer inside one worker, the vLLM generator inside the other, weights through torchstore.
The run trains and samples the trainer's exact policy (fp32 on both sides), and the workers outlive it. The
launcher is its own process, as a user starts it: its Monarch client must be created on TCP."""

import json
import os
import signal
import subprocess
import sys
import time

import psutil

from tests.support.gpu_models import free_port
from tests.support.paths import E2E_CONFIGS, REPO

DEADLINE_S = 900


def test_a_run_attaches_to_workers_already_running_and_they_outlive_it(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    addresses = {role: f"tcp://127.0.0.1:{free_port()}" for role in ("trainer", "generator")}
    workers = {
        role: subprocess.Popen(
            [sys.executable, "-m", "rl.cli", "worker", "--address", address], cwd=REPO, env=env, start_new_session=True
        )
        for role, address in addresses.items()
    }
    inside = dict.fromkeys(workers, 0)
    try:
        launcher = subprocess.Popen(
            [
                sys.executable, "-m", "rl.cli", "train", "--config", str(E2E_CONFIGS / "tiny_qwen3_process_2hosts.toml"),
                "--run.output_dir", str(tmp_path), "--run.eval_every", "0", "--cluster.scheduler", "attach",
                "--cluster.workers", "{ " + ", ".join(f'{r} = ["{a}"]' for r, a in addresses.items()) + " }",
            ],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + DEADLINE_S
        while launcher.poll() is None and time.monotonic() < deadline:
            for role, worker in workers.items():  # the run's processes, started inside the workers
                inside[role] = max(inside[role], len(psutil.Process(worker.pid).children(recursive=True)))
            time.sleep(1)
        if launcher.poll() is None:
            launcher.kill()
        output = launcher.communicate()[0]
        assert launcher.returncode == 0, output[-3000:]
        [run_dir] = [path for path in tmp_path.iterdir() if path.is_dir()]
        records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in records if r["step"] > 0]
        assert [r["step"] for r in steps] == [1, 2] and [r["policy_version"] for r in steps] == [1, 2]
        assert all(r["train/mismatch_k3"] < 1e-6 and r["train/num_loss_tokens"] > 0 for r in steps), steps
        assert inside["trainer"] >= 2 and inside["generator"] >= 1, inside  # 2 ranks; the vLLM generator
        assert all(w.poll() is None for w in workers.values())  # the user's workers outlive the run
    finally:
        for worker in workers.values():
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait(timeout=30)
