"""Two simulated hosts on the `process` scheduler: a 2-rank FSDP2 trainer on one, the vLLM generator on the other.

The weights cross "hosts" through torchstore: each rank puts its own shards into the store's volume on its own host
(the launcher holds none) and the generator reads them from there. After every sync the generator's prompt logprobs
must equal the trainer's (fp32 on both sides, as in tests/e2e/test_main_loop.py).
"""

import asyncio
import json
from pathlib import Path

import psutil
import pytest

from rl.config import load_config
from rl.loop.controller import Controller
from rl.weights import sync as weight_sync
from tests.support.launch import still_running
from tests.support.paths import E2E_CONFIGS

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

DEADLINE_S = 900


async def test_two_hosts_train_two_steps_and_the_generator_runs_the_trainers_weights(tmp_path):
    config = load_config(
        E2E_CONFIGS / "tiny_qwen3_process_2hosts.toml",
        {
            "run.output_dir": str(tmp_path),
            "tasks.0.rubric.reward_fns": "[{fn = 'tests.support.e2e_rewards:even_token_share'}]",
        },
    )
    controller = Controller(config)
    probe = list(range(100, 140))
    parity: list[tuple[int, float]] = []
    sync_weights = controller.sync_weights

    async def sync_and_compare(policy_version: int) -> dict[str, float]:
        synced = await sync_weights(policy_version)
        trainer, generator = await asyncio.gather(
            controller.roles.trainer.logprobs.call_one(probe),
            controller.roles.generators.call("prompt_logprobs", probe),
        )
        parity.append((policy_version, max(abs(a - b) for a, b in zip(trainer, generator))))
        return synced

    controller.sync_weights = sync_and_compare
    try:
        await asyncio.wait_for(controller.setup(), DEADLINE_S)
        hosts = dict(controller.roles.placement.hosts)
        store = (await weight_sync.ts.client()).strategy  # the weights' volumes: one on the trainer host, none here
        volumes = sorted((await store.storage_volumes.get_id.call()).values())
        trainer_extent = dict(controller.roles.trainer.mesh.extent)
        before = await controller.roles.trainer.logprobs.call_one(probe)
        summary = await asyncio.wait_for(controller.train(), DEADLINE_S)
        after = await controller.roles.trainer.logprobs.call_one(probe)
        workers = [
            p for p in psutil.Process().children(recursive=True) if "run_worker_loop_forever" in " ".join(p.cmdline())
        ]
    finally:
        await controller.shutdown()
    assert sorted(hosts) == ["generator", "trainer"] and trainer_extent == {"hosts": 1, "procs": 2}
    assert isinstance(store, weight_sync.TrainerHostVolumes) and volumes == ["0"]
    assert [version for version, _ in parity] == [1, 2] and all(gap < 1e-4 for _, gap in parity), parity
    assert max(abs(a - b) for a, b in zip(before, after)) > 1e-3  # training moved the policy
    records = [json.loads(line) for line in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2] and records[-1]["policy_version"] == 2
    assert all(r["train/num_loss_tokens"] > 0 and r["train/mismatch_k3"] < 1e-6 for r in records[1:])
    # hosts released: their workers are SIGTERMed, and SIGKILLed after a second (monarch's `ProcessJob`), not awaited
    assert workers and not still_running(workers)
