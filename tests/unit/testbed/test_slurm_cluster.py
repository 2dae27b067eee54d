"""testbed/slurm_cluster.py: a real Slurm on namespaced hosts runs a job's tasks on the nodes it names, under the
nodes' own hostnames, and leaves no daemon and no key behind."""

import psutil
import pytest

from testbed import hosts as namespaced
from testbed.slurm_cluster import slurm_cluster, unavailable

REASON = unavailable()
pytestmark = [pytest.mark.processes, pytest.mark.slurm, pytest.mark.skipif(REASON is not None, reason=REASON or "")]


def daemons_of(state_dir) -> list[int]:
    """Pids of the processes whose command line names `state_dir` (the cluster's daemons)."""
    pids = []
    for process in psutil.process_iter(["cmdline"]):
        if any(str(state_dir) in part for part in process.info["cmdline"] or []):
            pids.append(process.pid)
    return pids


def test_a_two_node_job_runs_one_task_on_each_node_under_its_hostname(tmp_path):
    state_dir = tmp_path / "slurm"
    with (
        namespaced.hosts(["login", "node1", "node2"], keep=[tmp_path]) as network,
        slurm_cluster(network, "login", ["node1", "node2"], state_dir) as cluster,
    ):
        assert cluster.node_states() == {"node1": "idle", "node2": "idle"}
        assert len(daemons_of(state_dir)) == 4  # munged, slurmctld, two slurmd
        ran = cluster.run("srun", "--nodes=2", "--label", "sh", "-c", "echo $(hostname) $SLURM_NODEID").stdout
        assert sorted(ran.splitlines()) == ["0: node1 0", "1: node2 1"]
        submitted = cluster.run("sbatch", "--parsable", "--nodes=1", "--output=/dev/null", "--wrap", "sleep 60").stdout
        running = lambda: cluster.run("squeue", "--noheader", "--states=RUNNING", "--format=%i").stdout.split()
        assert namespaced.wait_for(running, timeout=30, what="the batch job runs") == [submitted.strip()]
    assert daemons_of(state_dir) == []  # the running job cancelled, the daemons stopped
    assert not (state_dir / "munge.key").exists()
    assert (state_dir / "log" / "slurmctld.log").exists()
