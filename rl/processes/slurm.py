"""Monarch's `SlurmJob`, reading `squeue --json` from every Slurm that has it.

Monarch 0.7.0 reads the job's state as a list and its hosts from `job_resources.nodes.allocation[].name`, the shape
of Slurm 24.05+ (OpenAPI v0.0.41). Slurm 20.02-23.02 (v0.0.36-v0.0.39) writes the state as a string; those and
Slurm 23.11 (v0.0.40: the state already a list) write `job_resources.nodes` as a host-list string with the hosts in
`job_resources.allocated_nodes[].nodename`. Monarch then fails with "'str' object has no attribute 'get'" (meta-pytorch/monarch
#2330). `normalize_squeue_job` turns each older part into the newer one; the newer shape passes through unchanged.

Before 24.05 `squeue --json` also ignores `--job` ("All other formatting and filtering arguments will be ignored", the
22.05 man page) and lists every job in the cluster, while Monarch takes the first: on a real Slurm 22.05 with one
finished job in the queue, a new run was told its job had COMPLETED and cancelled it. `job_in_squeue` picks the job by
its id.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

from monarch.job import SlurmJob

from rl.console import warn


def normalize_squeue_job(job: dict[str, Any]) -> dict[str, Any]:
    """One job of `squeue --json` in the shape Monarch reads (Slurm 24.05+), whatever Slurm wrote it."""
    job = dict(job)
    if isinstance(job.get("job_state"), str):
        job["job_state"] = [job["job_state"]]
    resources = job.get("job_resources")
    if isinstance(resources, dict) and not isinstance(resources.get("nodes"), dict):
        hosts = [node["nodename"] for node in resources.get("allocated_nodes") or [] if "nodename" in node]
        job["job_resources"] = {**resources, "nodes": {"allocation": [{"name": host} for host in hosts]}}
    return job


def job_in_squeue(squeue_json: str, job_id: str) -> dict[str, Any] | None:
    """Job `job_id` of a `squeue --json` answer, normalized; None when it is not listed (finished and purged)."""
    for job in json.loads(squeue_json).get("jobs", []):
        if str(job.get("job_id")) == str(job_id):
            return normalize_squeue_job(job)
    return None


class RlmeshSlurmJob(SlurmJob):
    """`SlurmJob` whose squeue reader accepts Slurm's pre-24.05 JSON (see the module docstring)."""

    def _get_job_info_json(self, job_id: str) -> dict[str, Any] | None:
        """The job's `squeue --json` entry, None when squeue fails or does not list it (Monarch then stops waiting)."""
        result = subprocess.run(["squeue", "--job", job_id, "--json"], capture_output=True, text=True)
        if result.returncode != 0:
            warn(f"squeue for Slurm job {job_id} failed: {result.stderr.strip()}")
            return None
        try:
            return job_in_squeue(result.stdout, job_id) if result.stdout.strip() else None
        except json.JSONDecodeError as error:
            warn(f"squeue --json for Slurm job {job_id} is not JSON: {error}")
            return None
