"""Run the GPU suite (tests/gpu/) and write what it measured, with the machine it ran on, as one JSON file.

    python benchmarks/gpu_suite.py --out gpu_suite.json [extra pytest arguments]

Runs from the source tree (the repository root on PYTHONPATH, no install), so it works on a GPU machine without a
package registry: see docs/gpus-and-clusters.md for the wheels to carry. Exits with pytest's status.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def machine() -> dict[str, object]:
    """The versions and the device the numbers belong to."""
    import torch

    info: dict[str, object] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cpus": os.cpu_count(),
    }
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(0)
        info.update(
            gpu=properties.name,
            gpu_memory_gib=round(properties.total_memory / 2**30, 1),
            compute_capability=f"{properties.major}.{properties.minor}",
            nccl=".".join(map(str, torch.cuda.nccl.version())),
        )
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        pass
    return info


def outcomes(junit: Path) -> dict[str, dict[str, str]]:
    """Each test's outcome (passed, failed, error, skipped) and message, from pytest's JUnit XML."""
    result = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        status, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                status = "failed" if child.tag == "failure" else child.tag
                message = (child.get("message") or "")[:2000]
        result[name] = {"outcome": status, "message": message, "seconds": case.get("time", "")}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("gpu_suite.json"), help="the JSON file to write")
    args, pytest_args = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        measured, junit = Path(scratch) / "measured.json", Path(scratch) / "junit.xml"
        env = {
            **os.environ,
            "RLMESH_GPU_RESULTS": str(measured),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        }
        command = [sys.executable, "-m", "pytest", "tests/gpu", "-m", "gpu", "-rs", "-p", "no:cacheprovider"]
        code = subprocess.run([*command, f"--junitxml={junit}", *pytest_args], cwd=REPO, env=env).returncode
        report = {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "command": " ".join([*command, *pytest_args]),
            "exit_code": code,
            "machine": machine(),
            "tests": outcomes(junit) if junit.exists() else {},
            "measured": json.loads(measured.read_text()) if measured.exists() else {},
        }
    args.out.write_text(json.dumps(report, indent=2))
    print(f"written to {args.out}")
    return code


if __name__ == "__main__":
    sys.exit(main())
