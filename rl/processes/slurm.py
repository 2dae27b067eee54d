"""Monarch's `SlurmJob`, reading `squeue --json` from every Slurm that has it.

Monarch 0.7.0 reads the job's state as a list and its hosts from `job_resources.nodes.allocation[].name`, the shape
of Slurm 24.05+ (OpenAPI v0.0.41). Slurm 20.02-23.02 (v0.0.36-v0.0.39) writes the state as a string; those and
Slurm 23.11 (v0.0.40: the state already a list) write `job_resources.nodes` as a host-list string with the hosts in
`job_resources.allocated_nodes[].nodename`. Monarch then fails with "'str' object has no attribute 'get'" (monarch
issue 2330). `normalize_squeue_job` turns each older part into the newer one; the newer shape passes through unchanged.
"""

from __future__ import annotations

from typing import Any

from monarch.job import SlurmJob


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


class RlmeshSlurmJob(SlurmJob):
    """`SlurmJob` whose squeue reader accepts Slurm's pre-24.05 JSON (see the module docstring)."""

    def _get_job_info_json(self, job_id: str) -> dict[str, Any] | None:
        job = super()._get_job_info_json(job_id)
        return normalize_squeue_job(job) if job is not None else None
