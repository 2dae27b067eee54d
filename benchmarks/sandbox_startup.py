"""Start-up cost of one sandboxed tool call: the median wall time of N sequential calls of a tool
that returns at once (the shipped calculator on "1 + 2": `tools.calculator:calculate`), so nearly all of it is the
sandbox and Python starting. Usage: python benchmarks/sandbox_startup.py [--calls 100] [--no-isolate]"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from tools.sandbox import Sandbox, SandboxLimits


async def measure(calls: int, isolate: bool) -> list[float]:
    sandbox = Sandbox(SandboxLimits(timeout_s=60.0), isolate=isolate)
    seconds = []
    try:
        for _ in range(calls):
            start = time.perf_counter()
            assert await sandbox.run("tools.calculator:calculate", {"expression": "1 + 2"}) == "3"
            seconds.append(time.perf_counter() - start)
    finally:
        sandbox.close()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--no-isolate", action="store_true")
    args = parser.parse_args()
    seconds = asyncio.run(measure(args.calls, not args.no_isolate))
    load = os.getloadavg()
    print(
        f"{args.calls} calls: median {statistics.median(seconds) * 1000:.1f} ms, "
        f"p10 {statistics.quantiles(seconds, n=10)[0] * 1000:.1f} ms, p90 {statistics.quantiles(seconds, n=10)[-1] * 1000:.1f} ms "
        f"(load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})"
    )


if __name__ == "__main__":
    main()
