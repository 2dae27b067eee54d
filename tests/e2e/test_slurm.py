"""`rlmesh train` with `cluster.scheduler = "slurm"` on a real Slurm: Debian's Slurm 22.05 (munge, slurmctld and two
slurmd, testbed/slurm_cluster.py) on three namespaced hosts of this machine (testbed/hosts.py): the
launcher and slurmctld on `login`, the compute nodes `node1` and `node2`, each with its own hostname, network stack,
/tmp and /dev/shm; the repository, the venv, the model cache and the run directory are shared, as on a cluster with a
shared filesystem.

Monarch's `SlurmJob` (through `RlmeshSlurmJob`) submits the workers with `sbatch`, reads the hosts from the real
`squeue --json` of 22.05, and the launcher attaches to the workers over TCP by the nodes' host names; the 2-rank
trainer runs on one node, the vLLM generator on the other, weights cross through torchstore. It proves: the run
trains 2 steps and samples the trainer's exact policy after each sync (fp32 on both sides); each role's processes ran
inside its node's Slurm job; the run reads its own job although 22.05 lists every job (ended ones first); the
allocation is released at the end; a job sbatch refuses (more memory than a node has) stops the run at once with
Slurm's reason (exit 2). It cannot prove anything about GPUs (`gpus_per_node`, GRES), NCCL, RDMA, real
bandwidth or latency, cgroup enforcement of `mem`/`cpus_per_task`, or NFS (docs/gpus-and-clusters.md)."""

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rl.assets import cache_dir
from rl.processes.titles import role_of
from testbed import hosts as namespaced
from testbed.slurm_cluster import slurm_cluster, unavailable
from tests.support.paths import E2E_CONFIGS, REPO

REASON = unavailable()
pytestmark = [pytest.mark.slurm, pytest.mark.skipif(REASON is not None, reason=REASON or "")]

NODES = ["node1", "node2"]
RUN_DEADLINE_S = 600


LAUNCHER_ONLY = "RLMESH_TEST_LAUNCHER_ENV"  # set in the launcher's environment only, never in `cluster.env`


def roles_on(host: namespaced.Host) -> dict[str, bool]:
    """The rlmesh roles (process names) running on `host` now, each with whether it has `LAUNCHER_ONLY` set."""
    roles = {}
    for pid in host.pids():
        try:
            name = role_of(pid)
            if name.startswith(("trainer/", "generator")):
                roles[name] = f"{LAUNCHER_ONLY}=1".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:  # ended meanwhile
            pass
    return roles


def train(network: namespaced.Network, cluster, tmp_path: Path, name: str, *overrides: str) -> tuple[int, str, dict]:
    """`rlmesh train` of the tiny 2-host config with `scheduler = "slurm"` on `login` as run `name` under
    `tmp_path/runs`, to its end: (exit code, output, the roles seen on each node while it ran, see `roles_on`)."""
    launcher = network["login"].popen(
        [
            sys.executable, "-m", "rl.commands.cli", "train", "--config", str(E2E_CONFIGS / "tiny_qwen3_process_2hosts.toml"),
            "--run.output_dir", str(tmp_path / "runs"), "--run.name", name, "--run.eval_every", "0", "--wandb.enabled", "false",
            "--cluster.scheduler", "slurm", "--cluster.slurm.python_exe", sys.executable,
            "--cluster.slurm.log_dir", str(tmp_path / "slurm-logs"), "--cluster.slurm.time", "00:10:00",
            "--cluster.slurm.cpus_per_task", "2", *overrides,
        ],
        cwd=REPO, env={**cluster.env, "PYTHONPATH": str(REPO), LAUNCHER_ONLY: "1"}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    seen = {node: {} for node in NODES}
    deadline = time.monotonic() + RUN_DEADLINE_S
    while launcher.poll() is None and time.monotonic() < deadline:
        for node in NODES:
            seen[node].update(roles_on(network[node]))
        time.sleep(1)
    if launcher.poll() is None:
        launcher.kill()
    return launcher.returncode, launcher.communicate()[0], seen


def released(network: namespaced.Network, cluster, job_id: str, timeout_s: float = 60) -> tuple[list[str], dict]:
    """Job `job_id`'s state and the roles left on the nodes, once it has ended with none left or after `timeout_s`: the
    launcher's `scancel` returns before Slurm has ended the job (COMPLETING while slurmd stops its processes: SIGTERM,
    SIGKILL after `KillWait`), so the launcher may exit first."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = cluster.run("squeue", "--noheader", "--states=all", f"--jobs={job_id}", "--format=%T").stdout.split()
        left = {node: roles for node in NODES if (roles := roles_on(network[node]))}
        if (state in (["CANCELLED"], ["COMPLETED"]) and not left) or time.monotonic() > deadline:
            return state, left
        time.sleep(1)


def test_a_run_on_a_real_slurm_trains_on_its_nodes_and_releases_them(tmp_path):
    keep = [REPO, Path(sys.prefix), cache_dir(), tmp_path]
    with (
        namespaced.hosts(["login", *NODES], keep=keep) as network,
        slurm_cluster(network, "login", NODES, tmp_path / "slurm") as cluster,
    ):
        # sbatch refuses more memory than a node has: the run stops at once with Slurm's reason (set-up refused)
        returncode, output, _ = train(network, cluster, tmp_path, "refused", "--cluster.slurm.mem", "100G")
        assert returncode == 2, output[-4000:]
        assert (
            "rlmesh: cannot get the run's hosts from slurm: Failed to submit SLURM job: "
            "sbatch: error: Memory specification can not be satisfied" in output
        ), output[-4000:]
        # An ended job stays in the queue (MinJobAge, 300 s): 22.05's `squeue --json` lists it (and the refused one)
        # before the run's, which Monarch's own reader would take for the run's.
        cluster.run("srun", f"--nodes={len(NODES)}", "true")
        returncode, output, seen = train(network, cluster, tmp_path, "trained", "--cluster.slurm.mem", "4G")
        assert returncode == 0, output[-4000:] + "\n" + cluster.logs()
        [job_id] = re.findall(r"SLURM job (\d+) submitted", output)
        assert f"SLURM job {job_id} is running on 2 nodes: ['node1', 'node2']" in output
        listed = [job["job_id"] for job in json.loads(cluster.run("squeue", "--json").stdout)["jobs"]]
        assert listed.index(int(job_id)) > 0, listed  # not the first listed
        ended, left = released(network, cluster, job_id)
        assert ended in (["CANCELLED"], ["COMPLETED"]), ended  # the allocation released
        assert not left, left

    # trainer mesh first: Monarch gives the first host(s) of the allocation to the first role of `cluster.hosts`;
    # sbatch passes the launcher's environment to the job (--export=ALL, Slurm's default), its processes inherit it
    assert seen == {"node1": {"trainer/0": True, "trainer/1": True}, "node2": {"generator/0#0": True}}, seen
    run_dir = tmp_path / "runs" / "trained"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2] and [r["policy_version"] for r in steps] == [1, 2]
    assert all(r["train/mismatch_k3"] < 1e-6 and r["train/num_loss_tokens"] > 0 for r in steps), steps
