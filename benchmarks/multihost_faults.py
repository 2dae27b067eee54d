"""Faults across hosts: the multi-host run of tests/e2e/test_multihost.py (namespaced hosts, testbed/hosts.py) with
one fault injected after a step, measured: when it was noticed, what the run did (healed, or stopped with a resume
hint), how long it took against the configured deadlines. The table is in docs/gpus-and-clusters.md.

    flock /tmp/rlmesh-heavy.lock .venv/bin/python benchmarks/multihost_faults.py            # every scenario
    flock /tmp/rlmesh-heavy.lock .venv/bin/python benchmarks/multihost_faults.py gen_link_30  # some

Scenarios (`SCENARIOS`), each on fresh hosts and workers, the fault injected once `FAULT_AFTER_STEP` is in
metrics.jsonl:
- gen_host_killed: every process of the generator host (its worker, the vLLM replica) SIGKILLed.
- trainer_host_killed: every process of the second trainer host (worker, rank 1, its torchstore volume) SIGKILLed.
- gen_link_30 / gen_link_180: the generator host's link down 30 s / 180 s, then up again.
- trainer_link_30: the second trainer host's link down 30 s.
- gen_worker_restarted: the generator host's processes killed and its worker started again at the same address.

Each prints the launcher's lines from the fault on, with seconds since the fault, and a summary line; every host's
Monarch log (in its private /tmp) is copied to the scenario's output directory, `monarch-logs-HOST/`.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed import multihost

# the multi-host test's config
TINY_MULTIHOST = multihost.REPO / "tests" / "e2e" / "configs" / "tiny_qwen3_multihost.toml"

STEPS = 6
FAULT_AFTER_STEP = 2
RUN_LIMIT_S = 420
DEADLINES = {  # the configured deadlines the run is measured against (shortened from the defaults where noted)
    "--services.generator.probe_interval_s": "2",
    "--services.generator.probe_timeout_s": "60",  # the default
    "--services.generator.call_timeout_s": "120",  # default 600
    "--services.generator.start_timeout_s": "240",  # default 600
    "--trainer.call_timeout_s": "240",  # default 1800
    "--run.weight_sync_timeout_s": "240",  # default 600
    "--run.metrics_timeout_s": "120",  # default 300
}
NOTICE = ("lost", "error", "failed", "unreachable", "timed out", "took longer", "stopp", "recover", "resume")


def kill_host(name: str) -> Callable[[multihost.Cluster], str]:
    def fault(cluster: multihost.Cluster) -> str:
        killed = cluster.network[name].kill_all()
        return f"killed {len(killed)} processes of {name}"

    return fault


def link_down(name: str, seconds: float) -> Callable[[multihost.Cluster], str]:
    def fault(cluster: multihost.Cluster) -> str:
        host = cluster.network[name]
        host.link_down()
        time.sleep(seconds)
        host.link_up()
        return f"{name}'s link down {seconds:g} s, then up"

    return fault


def worker_restarted(name: str) -> Callable[[multihost.Cluster], str]:
    def fault(cluster: multihost.Cluster) -> str:
        killed = cluster.network[name].kill_all()
        cluster.start_worker(name)
        return f"killed {len(killed)} processes of {name}, its worker started again at {cluster.address(name)}"

    return fault


SCENARIOS: dict[str, Callable[[multihost.Cluster], str]] = {
    "gen_host_killed": kill_host("generator0"),
    "trainer_host_killed": kill_host("trainer1"),
    "gen_link_30": link_down("generator0", 30),
    "gen_link_180": link_down("generator0", 180),
    "trainer_link_30": link_down("trainer1", 30),
    "gen_worker_restarted": worker_restarted("generator0"),
}


def steps_done(run_dir: Path) -> int:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return 0
    return max((json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()), default=0)


def run(name: str) -> dict:
    output_dir = Path(tempfile.mkdtemp(prefix=f"rlmesh-faults-{name}-", dir="/tmp"))
    run_dir = output_dir / "tiny_qwen3_multihost"
    args = ["--config", str(TINY_MULTIHOST), "--run.output_dir", str(output_dir)]
    args += ["--run.steps", str(STEPS), "--checkpoint.every_steps", "2"]
    args += [item for pair in DEADLINES.items() for item in pair]
    with multihost.cluster(output_dir) as cluster:
        launch = cluster.launch(*args)
        while steps_done(run_dir) < FAULT_AFTER_STEP and launch.process.poll() is None:
            time.sleep(0.2)
        if launch.process.poll() is not None:
            launch.wait(10)
            return {"scenario": name, "error": "the run ended before the fault", "output": launch.output[-3000:]}
        fault_at = time.monotonic()
        step_at_fault = steps_done(run_dir)
        what = SCENARIOS[name](cluster)
        fault_done = time.monotonic()
        code = launch.wait(timeout=max(1.0, RUN_LIMIT_S - (time.monotonic() - launch.started)))
        ended = time.monotonic()
        for host in ("launcher", *multihost.HOSTS["trainer"], *multihost.HOSTS["generator"]):  # before /tmp goes
            cluster.network[host].run(["sh", "-c", f'cp -r "/tmp/$(id -un)" {output_dir}/monarch-logs-{host}'])
    after = [(at - fault_at, line) for at, line in launch.lines if at >= fault_at]
    noticed = next(((t, line) for t, line in after if any(word in line.lower() for word in NOTICE)), None)
    print(f"\n=== {name}: {what} (after step {step_at_fault})")
    for t, line in after:
        print(f"  +{t:7.1f} s | {line[:300]}")
    summary = {
        "scenario": name,
        "fault": what,
        "fault_after_step": step_at_fault,
        "fault_lasted_s": round(fault_done - fault_at, 1),
        "noticed_s": None if noticed is None else round(noticed[0], 1),
        "noticed_line": None if noticed is None else noticed[1][:300],
        "exit_code": code,
        "steps_done": steps_done(run_dir),
        "resume_hint": "--resume" in launch.output,
        "end_s_after_fault": round(ended - fault_at, 1),
        "run_s": round(ended - launch.started, 1),
        "output_dir": str(output_dir),
    }
    print("SUMMARY " + json.dumps(summary))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenarios", nargs="*", help=f"some of {', '.join(SCENARIOS)} (default: all)")
    names = parser.parse_args().scenarios or list(SCENARIOS)
    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenarios {unknown}; known: {', '.join(SCENARIOS)}")
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}; steps {STEPS}, fault after step {FAULT_AFTER_STEP}; {DEADLINES}")
    for name in names:
        run(name)


if __name__ == "__main__":
    main()
