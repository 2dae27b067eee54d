"""The decode-GEMM timing of `benchmarks/generation_profile.py --gemms`: it multiplies the weights vLLM multiplies (the
roofline's count of them) and every path it times computes the same product."""

import importlib.util
from pathlib import Path

import pytest
import torch

from rl.assets import resolve_model_path
from rl.commands.roofline import decode_model

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "generation_profile.py"


def generation_profile():
    spec = importlib.util.spec_from_file_location("generation_profile", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_decoder_gemms_are_smollm2s_fused_projections_and_all_its_weights_but_embedding_and_norms():
    # q/k/v fused: 576 -> 9 x 64 + 2 x 3 x 64 = 960; gate/up fused: 576 -> 2 x 1536. A layer: 576 x 960 + 576 x 576 +
    # 576 x 3072 + 1536 x 576 = 3,538,944; 30 layers = 106,168,320 = 134,515,008 (the roofline's count) - the tied
    # embedding 49,152 x 576 = 28,311,552 - 61 norms of 576 = 35,136
    path = resolve_model_path("smollm2-135m-instruct")
    shapes = generation_profile().decoder_gemm_shapes(path)
    assert shapes == [("qkv", 576, 960), ("o", 576, 576), ("gate_up", 576, 3072), ("down", 1536, 576)]
    assert 30 * sum(k * n for _, k, n in shapes) == decode_model(path, dtype_bytes=4).parameters - 28_311_552 - 35_136


@pytest.mark.processes  # importing vLLM's custom ops starts a process
def test_every_timed_gemm_path_computes_the_rows_times_the_transposed_weight():
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(96, 64, generator=generator), torch.randn(64, 160, generator=generator)]  # [N, K]
    paths = generation_profile().gemm_paths(weights)
    assert len(paths) == 5
    for name, gemm in paths.items():
        for i, weight in enumerate(weights):
            x = torch.randn(32, weight.shape[1], generator=generator)
            expected = (x.double() @ weight.double().T).float()  # fp64 reference
            torch.testing.assert_close(gemm(x, i), expected, rtol=1e-4, atol=1e-4, msg=name)
