"""The real loop on one GPU (the shipped GPU config: trainer and generator share the GPU), a few steps, fp32 and then
bf16 sampler + bf16 autocast with the correction preset. Needs vLLM and Monarch on the GPU machine: skipped, with the
reason, where they are not installed (a machine without a package registry runs the rest of the suite)."""

import asyncio
import importlib.util
import json
import math
from pathlib import Path

import pytest

from tests.support.paths import CONFIGS

MISSING = [name for name in ("vllm", "monarch", "torchstore") if importlib.util.find_spec(name) is None]
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"the whole loop needs {', '.join(MISSING)} installed")

PRECISIONS = {
    "fp32": {"generator.dtype": "float32", "trainer.dtype": "float32"},  # the preset stays: on-policy, it is inert
    "bf16": {},  # the shipped config: bf16 sampler, bf16 autocast over fp32 weights, decoupled_token_is
}


@pytest.mark.parametrize("precision", PRECISIONS)
def test_the_gpu_config_trains_on_one_gpu(tmp_path, precision, record):
    from rl.config import load_config
    from rl.loop.controller import Controller

    overrides = {
        "run.output_dir": str(tmp_path),
        "run.steps": "4",
        "run.groups_per_step": "8",
        "run.eval_every": "0",
        **PRECISIONS[precision],
    }
    summary = asyncio.run(Controller(load_config(CONFIGS / "sum_digits_smollm2_gpu.toml", overrides)).run())
    records = [json.loads(line) for line in (Path(summary["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if r["step"] > 0]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    mismatch = [r["train/mismatch_k3"] for r in steps]
    record(
        mismatch_k3=mismatch,
        step_s=[r["time/step_s"] for r in steps],
        weight_sync_s=[r["time/weight_sync_s"] for r in steps],
        generation_tokens_per_s=[r["perf/generation_tokens_per_s"] for r in steps],
        reward_mean=[r["reward/mean"] for r in steps],
    )
    assert all(math.isfinite(r["loss"]) for r in steps)
    if precision == "fp32":  # the same weights on both sides: only the kernels differ
        assert max(abs(m) for m in mismatch) < 1e-4, mismatch
