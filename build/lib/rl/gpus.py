"""This host's CUDA devices, asked in a child process so the launcher never holds a CUDA context.

A CUDA query in the launcher (`torch.cuda.is_bf16_supported()` calls `current_device()`) creates a context
on GPU 0 that lives as long as the run: about half a GB that a generator's start-up free-memory check then
counts against it. The child process's context goes when it exits.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from dataclasses import dataclass

_PROBE = """
import json, torch
count = torch.cuda.device_count() if torch.cuda.is_available() else 0
bf16 = count > 0 and all(torch.cuda.get_device_capability(i) >= (8, 0) for i in range(count))
print(json.dumps({"count": count, "bf16": bf16}))
"""


@dataclass(frozen=True)
class Gpus:
    count: int
    """CUDA devices this process could see (`CUDA_VISIBLE_DEVICES` applies)."""
    bf16: bool
    """Every one runs bf16 natively (compute capability 8.0 or newer: Ampere, Hopper, ...)."""


@functools.cache
def local_gpus() -> Gpus:
    """The devices of this host, asked once per process by a child Python (a few seconds: it imports torch)."""
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"asking the CUDA devices failed: {done.stderr.strip()[-500:]}")
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    return Gpus(count=int(answer["count"]), bf16=bool(answer["bf16"]))
