"""How long a generator replica's death costs: SIGKILL one of 2 replicas mid-run, time its replacement.

Not a test: `python benchmarks/respawn_time.py --config configs/sum_digits_smollm2_cpu.toml` runs 3 steps
with 2 generator replicas, kills replica 0 by pid while it holds requests of step 2, and prints the
seconds from the kill to the loss being noticed and to the replacement taking traffic.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import tempfile
import time

from rl.config import load_config
from rl.loop.controller import Controller


async def measure(config_path: str) -> None:
    with tempfile.TemporaryDirectory() as output_dir:
        overrides = {
            "run.output_dir": output_dir,
            "run.steps": "3",
            "run.eval_every": "0",
            "generator.num_replicas": "2",
            "wandb.enabled": "false",
        }
        controller = Controller(load_config(config_path, overrides))
        await controller.setup()
        try:
            training = asyncio.ensure_future(controller.train())
            generators = controller.roles.generators
            while not (controller.state.step >= 1 and generators.ledger.on(0)):  # replica 0 holds requests of step 2
                await asyncio.sleep(0.002)
            os.kill(generators.replicas[0].pid, signal.SIGKILL)
            killed_at = time.monotonic()
            await training
            while not generators.recoveries:
                await asyncio.sleep(0.05)
        finally:
            await controller.shutdown()
    [(lost_at, serving_at)] = generators.recoveries
    print(
        f"SIGKILL -> loss noticed {lost_at - killed_at:.1f} s -> replacement taking traffic {serving_at - killed_at:.1f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/sum_digits_smollm2_cpu.toml")
    asyncio.run(measure(parser.parse_args().config))


if __name__ == "__main__":
    main()
