"""Monarch's Slurm job reads `squeue --json` of Slurm before 24.05 through `RlmeshSlurmJob`.

The fixture is real output: `squeue --job 2 --json` of Slurm 22.05.8 (Debian 12's slurmctld/slurmd, one node "vm",
a running batch job), captured 2026-11-25. Monarch's own `_wait_for_job_start` parses it, with `squeue` answered
from the file; the job objects are made without `__init__`, which would switch this process to TCP transport.
Importing `monarch.job` imports flask, after which an in-process vLLM engine cannot start in this process
(tests/conftest.py), so these tests import it themselves and run with the `allocates_job` tests, last.
"""

import json
import subprocess

import pytest

from tests.support.paths import REPO

pytestmark = pytest.mark.allocates_job

SQUEUE_22_05 = (REPO / "tests" / "support" / "fixtures" / "squeue" / "slurm-22.05.8.json").read_text()


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
