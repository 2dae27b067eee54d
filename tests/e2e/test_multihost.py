"""A run across four namespaced hosts of this machine (tests/support/hosts.py): the launcher on one, a 2-rank trainer
across two (one rank each, gloo over TCP), the vLLM generator on the fourth. Each host has its own hostname, network
stack, /tmp and /dev/shm; only the repository, the venv, the model cache and the run directory are shared, as on a
cluster with a shared filesystem. The hosts' workers already run (`rlmesh worker`), the launcher attaches to them
(`scheduler = "attach"`), weights cross hosts through torchstore over TCP.

It proves: the run trains and samples the trainer's exact policy after every sync (fp32 on both sides); every
process ran on the host it was placed on and saw that host's name; a checkpoint written by ranks on other hosts
resumes. It cannot prove anything about GPUs, NCCL, RDMA, real bandwidth or latency, or NFS semantics
(docs/gpus-and-clusters.md)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rl.assets import cache_dir
from tests.support import hosts as namespaced
from tests.support.paths import E2E_CONFIGS, REPO

REASON = namespaced.unavailable()
pytestmark = [pytest.mark.multihost, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

CONFIG = E2E_CONFIGS / "tiny_qwen3_multihost.toml"
WORKER_PORT = 26600  # every host has its own ports
HOSTS = {"trainer": ["trainer0", "trainer1"], "generator": ["generator0"]}
RUN_DEADLINE_S = 600
WORKER_ENV = ("PATH", "HOME", "LANG", "RLMESH_CACHE")


class Cluster:
    def __init__(self, network: namespaced.Network, output_dir: Path):
        self.network = network
        self.output_dir = output_dir
        self.env = {**os.environ, "PYTHONPATH": str(REPO)}
        # a worker started on its host (over SSH, by a service manager) has a login's environment, not the launcher's
        self.worker_env = {key: os.environ[key] for key in WORKER_ENV if key in os.environ} | {"PYTHONPATH": str(REPO)}
        self.workers = {}

    def start_worker(self, name: str) -> None:
        host = self.network[name]
        self.workers[name] = host.popen(
            [sys.executable, "-m", "rl.cli", "worker", "--address", f"tcp://{host.ip}:{WORKER_PORT}"],
            cwd=REPO,
            env=self.worker_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def addresses(self) -> str:
        """`cluster.workers` as a TOML inline table: each role's hosts' worker addresses."""
        roles = {
            role: [f"tcp://{self.network[name].ip}:{WORKER_PORT}" for name in names] for role, names in HOSTS.items()
        }
        return "{ " + ", ".join(f"{role} = {json.dumps(addresses)}" for role, addresses in roles.items()) + " }"

    def train(self, *args: str) -> tuple[int, str]:
        """`rlmesh train ARGS` in the launcher's host, to its end: (exit code, output)."""
        launcher = self.network["launcher"].popen(
            [sys.executable, "-m", "rl.cli", "train", *args, "--cluster.workers", self.addresses()],
            cwd=REPO,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            output, _ = launcher.communicate(timeout=RUN_DEADLINE_S)
        except subprocess.TimeoutExpired:
            launcher.kill()
            output = launcher.communicate()[0] + f"\n[test] killed after {RUN_DEADLINE_S} s"
        return launcher.returncode, output


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("multihost")
    keep = [REPO, Path(sys.prefix), cache_dir(), output_dir]
    names = ["launcher", *(name for names in HOSTS.values() for name in names)]
    with namespaced.hosts(names, keep=keep) as network:
        made = Cluster(network, output_dir)
        for role_hosts in HOSTS.values():
            for name in role_hosts:
                made.start_worker(name)
        yield made


@pytest.fixture(scope="module")
def first_run(cluster):
    started = time.monotonic()
    code, output = cluster.train("--config", str(CONFIG), "--run.output_dir", str(cluster.output_dir))
    print(f"[multihost] first run: {time.monotonic() - started:.1f} s")
    assert code == 0, output[-4000:]
    return cluster.output_dir / "tiny_qwen3_multihost", output


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_generator_samples_the_trainers_exact_weights_after_every_sync_across_hosts(first_run):
    run_dir, output = first_run
    steps = [r for r in records(run_dir) if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2] and [r["policy_version"] for r in steps] == [1, 2]
    assert all(r["train/mismatch_k3"] < 1e-6 and r["train/num_loss_tokens"] > 0 for r in steps), steps
    # every actor answered with the name of the host it was placed on (rank 0 on the first trainer host)
    assert "on hosts: trainer ranks on trainer0, trainer1; generator on generator0; reward on launcher" in output, (
        output
    )


def test_a_checkpoint_written_by_ranks_on_other_hosts_resumes(cluster, first_run):
    run_dir, _ = first_run
    code, output = cluster.train("--resume", str(run_dir), "--run.steps", "3")
    assert code == 0, output[-4000:]
    steps = [r for r in records(run_dir) if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2, 3], steps
    assert steps[-1]["train/mismatch_k3"] < 1e-6
