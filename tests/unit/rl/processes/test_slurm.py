"""Monarch's Slurm job reads `squeue --json` of Slurm before 24.05 through `RlmeshSlurmJob`.

The fixtures are real output of Slurm 22.05.8 (Debian 12's slurmctld/slurmd): `squeue --job 2 --json` on one node "vm"
with one running batch job (captured 2026-11-25), and `squeue --job 4 --json` on the two-node cluster of
testbed/slurm_cluster.py (nodes node1, node2 in their own network namespaces) while job 4 ran and jobs 1-3 had
ended (captured 2026-11-26): it lists all four, job 1 first, since 22.05's `--json` ignores `--job`. Monarch's own `_wait_for_job_start` parses it, with `squeue` answered
from the file; the job objects are made without `__init__`, which would switch this process to TCP transport.
Importing `monarch.job` imports flask, whose context proxies an in-process vLLM engine must not see
(tests/support/inprocess_engine.py), so these tests import it themselves.
"""

import json
import subprocess

import pytest

from tests.support.paths import REPO

SQUEUE = REPO / "tests" / "support" / "fixtures" / "squeue"
SQUEUE_22_05 = (SQUEUE / "slurm-22.05.8.json").read_text()
SQUEUE_22_05_JOB_4_OF_4 = (SQUEUE / "slurm-22.05.8-job-4-of-4.json").read_text()


def job_answering_squeue_with(cls: type, stdout: str, monkeypatch: pytest.MonkeyPatch):
    def fake_run(args, **kwargs):
        assert args[:1] == ["squeue"], args
        return subprocess.CompletedProcess(args, 0, stdout=stdout, stderr="")

    monkeypatch.setattr(subprocess, "run", fake_run)
    job = cls.__new__(cls)
    job._kill = lambda: None
    return job


def test_monarchs_parser_fails_on_slurm_22_05s_squeue_json(monkeypatch):
    from monarch.job import SlurmJob

    job = job_answering_squeue_with(SlurmJob, SQUEUE_22_05, monkeypatch)
    with pytest.raises(AttributeError, match="'str' object has no attribute 'get'"):
        job._wait_for_job_start("2", expected_nodes=1, timeout=5)


def test_the_hosts_of_a_slurm_22_05_job_are_read(monkeypatch):
    from rl.processes.slurm import RlmeshSlurmJob

    job = job_answering_squeue_with(RlmeshSlurmJob, SQUEUE_22_05, monkeypatch)
    assert job._wait_for_job_start("2", expected_nodes=1, timeout=5) == ["vm"]


def test_a_newer_slurms_job_passes_through_unchanged(monkeypatch):
    """Slurm 24.05+ (v0.0.41): the state a list, the hosts under `job_resources.nodes.allocation` (what Monarch reads)."""
    from rl.processes.slurm import RlmeshSlurmJob, normalize_squeue_job

    newer = {
        "job_id": 7,
        "job_state": ["RUNNING"],
        "job_resources": {"nodes": {"count": 2, "allocation": [{"name": "a"}, {"name": "b"}]}},
    }
    assert normalize_squeue_job(newer) == newer
    job = job_answering_squeue_with(RlmeshSlurmJob, json.dumps({"jobs": [newer]}), monkeypatch)
    assert job._wait_for_job_start("7", expected_nodes=2, timeout=5) == ["a", "b"]


def test_a_pending_old_style_job_has_no_hosts_yet():
    from rl.processes.slurm import normalize_squeue_job

    pending = {"job_id": 3, "job_state": "PENDING", "job_resources": {}}
    assert normalize_squeue_job(pending) == {
        "job_id": 3,
        "job_state": ["PENDING"],
        "job_resources": {"nodes": {"allocation": []}},
    }


def test_a_slurm_23_11_job_is_read(monkeypatch):
    """Slurm 23.11 (OpenAPI v0.0.40): the state already a list, but `job_resources.nodes` still a host-list string and
    the hosts under `allocated_nodes` (the v0.0.40 schema: `job_state` List[str]; `job_resources` {nodes: str,
    allocated_cores, allocated_cpus, allocated_hosts: int, allocated_nodes: [object]}; the node objects' keys as in the
    22.05.8 output above). Monarch's own reader fails on it too."""
    from monarch.job import SlurmJob

    from rl.processes.slurm import RlmeshSlurmJob

    job = {
        "job_id": 11,
        "job_state": ["RUNNING"],
        "nodes": "node[1-2]",
        "job_resources": {
            "nodes": "node[1-2]",
            "allocated_cores": 2,
            "allocated_cpus": 2,
            "allocated_hosts": 2,
            "allocated_nodes": [{"sockets": {}, "nodename": "node1"}, {"sockets": {}, "nodename": "node2"}],
        },
    }
    answer = json.dumps({"jobs": [job]})
    with pytest.raises(AttributeError, match="'str' object has no attribute 'get'"):
        job_answering_squeue_with(SlurmJob, answer, monkeypatch)._wait_for_job_start("11", expected_nodes=2, timeout=5)
    rlmesh_job = job_answering_squeue_with(RlmeshSlurmJob, answer, monkeypatch)
    assert rlmesh_job._wait_for_job_start("11", expected_nodes=2, timeout=5) == ["node1", "node2"]


def test_slurm_22_05_lists_every_job_and_monarch_takes_the_first(monkeypatch):
    """What a real Slurm 22.05 did to a run: its job (4) was running, but Monarch read job 1's COMPLETED, took the run's
    job for ended and cancelled it."""
    from monarch.job import SlurmJob

    job = job_answering_squeue_with(SlurmJob, SQUEUE_22_05_JOB_4_OF_4, monkeypatch)
    job._status, job._slurm_job_id = "running", "4"
    assert job._get_job_info_json("4")["job_id"] == 1
    assert not job._jobs_active()


def test_the_run_reads_its_own_job_among_all_that_slurm_22_05_lists(monkeypatch):
    from rl.processes.slurm import RlmeshSlurmJob

    job = job_answering_squeue_with(RlmeshSlurmJob, SQUEUE_22_05_JOB_4_OF_4, monkeypatch)
    job._status, job._slurm_job_id = "running", "4"
    assert job._get_job_info_json("4")["job_state"] == ["RUNNING"]
    assert job._jobs_active()
    assert job._wait_for_job_start("4", expected_nodes=2, timeout=5) == ["node1", "node2"]
    assert job._get_job_info_json("3")["job_state"] == ["CANCELLED"]  # an ended job is still read as ended
    assert job._get_job_info_json("5") is None  # not listed: Monarch stops waiting ("not found in queue")


def test_a_failing_squeue_is_no_job_with_a_warning(monkeypatch, capsys):
    from rl.processes.slurm import RlmeshSlurmJob

    def failing_squeue(args, **kwargs):
        return subprocess.CompletedProcess(
            args, 1, stdout="", stderr="squeue: error: Unable to contact slurm controller"
        )

    monkeypatch.setattr(subprocess, "run", failing_squeue)
    job = RlmeshSlurmJob.__new__(RlmeshSlurmJob)
    assert job._get_job_info_json("4") is None
    assert "Unable to contact slurm controller" in capsys.readouterr().err
