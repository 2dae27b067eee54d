"""Weight fingerprints and the check of a generator's measurement against them (`rl.weights.attestation`).

The fingerprints are checked against sums written out by hand in float64; the pieces a generator measures are cut
from a fused, tensor-parallel layout built here by hand (q/k/v rows stacked, two ranks each holding half the rows or
half the columns), and measured both from the bytes and through a matmul "kernel" that rounds to its dtype. The
fault-injection tests (marker `attestation`) each break one thing and expect that reason in the verdict.
"""

import math
from dataclasses import replace

import pytest
import torch

from rl.weights.attestation import (
    Fingerprints,
    Piece,
    check,
    exact_piece,
    fingerprint,
    fingerprint_state_dict,
    kernel_inputs,
    kernel_piece,
    probe_vectors,
)

SEED = 7


def by_hand(name: str, tensor: torch.Tensor) -> tuple[float, float, float]:
    """sum, uᵀWv and ‖W‖ as float64 loops over the elements."""
    rows, cols = tensor.shape[0], tensor.numel() // tensor.shape[0]
    u, v = probe_vectors(name, tuple(tensor.shape), SEED)
    values = tensor.reshape(rows, cols).double().tolist()
    total = sum(sum(row) for row in values)
    projection = sum(u[i].item() * values[i][j] * v[j].item() for i in range(rows) for j in range(cols))
    norm = math.sqrt(sum(x * x for row in values for x in row))
    return total, projection, norm


def test_a_fingerprint_is_the_sum_the_seeded_projection_and_the_norm():
    weight = torch.tensor([[0.5, -1.25, 2.0], [3.0, 0.75, -0.5]])
    printed = fingerprint("w", weight, SEED)
    total, projection, norm = by_hand("w", weight)
    assert (printed.sum, printed.projection) == (total, projection)  # small exact binary fractions: no rounding
    assert printed.norm == pytest.approx(norm, rel=1e-7)
    assert (printed.shape, printed.dtype) == ((2, 3), "float32")
    column = torch.randn(5)
    assert fingerprint("b", column, SEED).projection == pytest.approx(by_hand("b", column)[1], rel=1e-6)


def test_probe_vectors_are_signs_seeded_by_name_and_shared_by_tensors_of_one_input_width():
    u, v = probe_vectors("model.layers.0.self_attn.q_proj.weight", (64, 6), SEED)
    assert set(u.tolist()) == set(v.tolist()) == {-1.0, 1.0}
    again_u, again_v = probe_vectors("model.layers.0.self_attn.q_proj.weight", (64, 6), SEED)
    assert torch.equal(u, again_u) and torch.equal(v, again_v)
    other_u, other_v = probe_vectors("model.layers.0.self_attn.k_proj.weight", (32, 6), SEED)
    assert torch.equal(v, other_v)  # same input width: a fused qkv layer measures all three parts in one call
    assert not torch.equal(u[:32], other_u)


def fused_layout(weights: dict[str, torch.Tensor], ranks: int, split: str) -> list[tuple[str, tuple, tuple]]:
    """(name, rows, cols) of every block `ranks` workers hold: each tensor's rows (column-parallel) or columns
    (row-parallel) cut evenly, as vLLM shards a fused layer."""
    blocks = []
    for name, weight in weights.items():
        rows, cols = weight.shape
        for rank in range(ranks):
            if split == "rows":
                size = rows // ranks
                blocks.append((name, (rank * size, (rank + 1) * size), (0, cols)))
            else:
                size = cols // ranks
                blocks.append((name, (0, rows), (rank * size, (rank + 1) * size)))
    return blocks


def measure(weights, blocks, how="exact", kernel_dtype=torch.float32):
    """Each block measured from its bytes, or through a matmul on the probe inputs whose output is rounded to
    `kernel_dtype` (what vLLM's CPU kernel returns)."""
    pieces = []
    for name, rows, cols in blocks:
        weight = weights[name]
        block = weight[rows[0] : rows[1], cols[0] : cols[1]]
        if how == "exact":
            pieces.append(exact_piece(name, block, tuple(weight.shape), rows, cols, SEED))
        else:
            inputs = kernel_inputs(name, tuple(weight.shape), cols, SEED).to(kernel_dtype)
            outputs = (inputs.float() @ block.float().t()).to(kernel_dtype)  # [2, rows]
            pieces.append(kernel_piece(name, outputs, tuple(weight.shape), rows, cols, kernel_dtype, SEED))
    return pieces


@pytest.fixture
def layer():
    generator = torch.Generator().manual_seed(0)
    return {
        name: torch.randn(rows, 64, generator=generator) * 0.04
        for name, rows in (("q_proj.weight", 64), ("k_proj.weight", 16), ("v_proj.weight", 16))
    }


@pytest.mark.parametrize("ranks, split", [(1, "rows"), (2, "rows"), (2, "cols")])
@pytest.mark.parametrize("how", ["exact", "kernel"])
def test_the_pieces_of_a_fused_sharded_layer_add_up_to_the_published_fingerprints(layer, ranks, split, how):
    expected = fingerprint_state_dict(layer, policy_version=3, seed=SEED)
    verdict = check(
        expected, measure(layer, fused_layout(layer, ranks, split), how), served_version=3, previous_version=2
    )
    assert verdict.attested, verdict.failures
    assert verdict.tensors == 3 and verdict.kernel_tensors == (3 if how == "kernel" else 0)


def test_a_bf16_kernels_output_rounding_is_within_its_tolerance(layer):
    bf16 = {name: weight.to(torch.bfloat16) for name, weight in layer.items()}
    expected = fingerprint_state_dict(bf16, policy_version=1, seed=SEED)
    pieces = measure(bf16, fused_layout(bf16, 1, "rows"), "kernel", kernel_dtype=torch.bfloat16)
    assert check(expected, pieces, served_version=1, previous_version=0).attested


def test_tied_tensors_are_fingerprinted_once_under_their_first_name():
    embedding = torch.randn(10, 4)
    printed = fingerprint_state_dict({"embed.weight": embedding, "lm_head.weight": embedding}, 1, SEED)
    assert list(printed.tensors) == ["embed.weight"]


def verdict_of(layer, expected_version=2, *, served=2, previous=1, pieces=None, published=None) -> list[str]:
    expected = fingerprint_state_dict(published or layer, expected_version, SEED)
    pieces = measure(layer, fused_layout(layer, 2, "rows")) if pieces is None else pieces
    return check(expected, pieces, served_version=served, previous_version=previous).failures


@pytest.mark.attestation
def test_a_dropped_tensor_is_detected(layer):
    pieces = [piece for piece in measure(layer, fused_layout(layer, 2, "rows")) if piece.name != "k_proj.weight"]
    assert verdict_of(layer, pieces=pieces) == ["k_proj.weight: not found in the served model"]


@pytest.mark.attestation
def test_a_shard_that_never_arrived_is_detected(layer):
    pieces = measure(layer, fused_layout(layer, 2, "rows"))[1:]  # rank 0's q rows missing
    assert verdict_of(layer, pieces=pieces) == ["q_proj.weight: the served model holds 2048 of its 4096 elements"]


@pytest.mark.attestation
def test_a_zeroed_tensor_is_detected(layer):
    served = {**layer, "v_proj.weight": torch.zeros_like(layer["v_proj.weight"])}
    failures = verdict_of(layer, pieces=measure(served, fused_layout(served, 2, "rows")))
    assert len(failures) == 1 and failures[0].startswith("v_proj.weight: sum 0, published")


@pytest.mark.attestation
@pytest.mark.parametrize("how", ["exact", "kernel"])
def test_a_served_nan_is_detected(layer, how):
    """One NaN element makes a sum NaN, and NaN compares false with any bound: the check must fail, not pass."""
    served = {**layer, "k_proj.weight": layer["k_proj.weight"].clone()}
    served["k_proj.weight"][3, 5] = float("nan")
    failures = verdict_of(layer, pieces=measure(served, fused_layout(served, 2, "rows"), how))
    assert len(failures) == 1 and failures[0].startswith("k_proj.weight: sum nan, published")


@pytest.mark.attestation
def test_non_finite_published_weights_prove_nothing(layer):
    """A version whose published weights hold an inf or NaN is not attested even when the served copy holds the same."""
    broken = {**layer, "q_proj.weight": layer["q_proj.weight"].clone()}
    broken["q_proj.weight"][0, 0] = float("inf")
    failures = verdict_of(broken, published=broken)
    assert failures == ["q_proj.weight: the published weights are not finite"]


@pytest.mark.attestation
@pytest.mark.parametrize("how", ["exact", "kernel"])
def test_the_previous_version_is_detected_after_one_small_optimizer_step(layer, how):
    """One Adam-sized step (1e-5 per element, weights of rms 0.04) moves every tensor beyond the fp32 tolerance."""
    generator = torch.Generator().manual_seed(1)
    stepped = {
        name: weight + 1e-5 * torch.sign(torch.randn(weight.shape, generator=generator))
        for name, weight in layer.items()
    }
    stale = measure(layer, fused_layout(layer, 2, "rows"), how)
    failures = verdict_of(layer, pieces=stale, published=stepped)
    assert sorted(failure.split(":")[0] for failure in failures) == sorted(layer)


@pytest.mark.attestation
def test_a_wrong_dtype_is_detected(layer):
    served = {name: weight.to(torch.bfloat16) for name, weight in layer.items()}
    failures = verdict_of(layer, pieces=measure(served, fused_layout(served, 2, "rows")))
    assert "q_proj.weight: served in bfloat16, published in float32" in failures


@pytest.mark.attestation
def test_bf16_rounded_values_in_an_fp32_model_are_detected(layer):
    """A cast to bf16 somewhere on the way, loaded back into an fp32 model: the dtype is right, the values are not."""
    served = {name: weight.to(torch.bfloat16).float() for name, weight in layer.items()}
    failures = verdict_of(layer, pieces=measure(served, fused_layout(served, 2, "rows"), "kernel"))
    assert sorted(failure.split(":")[0] for failure in failures) == sorted(layer)


@pytest.mark.attestation
def test_a_stale_served_version_is_detected(layer):
    assert verdict_of(layer, served=1, previous=1) == [
        "serves version 1, published 2",
        "version counter went from 1 to 1 (not forward)",
    ]


@pytest.mark.attestation
def test_a_rolled_back_version_counter_is_detected(layer):
    """The weights and the stamped version agree, but the counter went back from the version served before."""
    assert verdict_of(layer, served=2, previous=5) == ["version counter went from 5 to 2 (not forward)"]
    assert verdict_of(layer, expected_version=0, served=0, previous=0) == []  # a fresh replica at the initial policy


@pytest.mark.attestation
def test_a_version_moved_back_on_purpose_is_attested_and_its_weights_still_checked(layer):
    """A trainer recovery reloads the last checkpoint's older version (`Fingerprints.rewind`): the counter may go
    back this once, but the weights and the stamped version must still match."""
    rewound = replace(fingerprint_state_dict(layer, 2, SEED), rewind=True)
    pieces = measure(layer, fused_layout(layer, 2, "rows"))
    assert check(rewound, pieces, served_version=2, previous_version=5).failures == []
    zeroed = [replace(piece, sum=0.0) if piece.name == "k_proj.weight" else piece for piece in pieces]
    assert check(rewound, zeroed, served_version=2, previous_version=5).failures != []
    assert check(rewound, pieces, served_version=5, previous_version=5).failures == ["serves version 5, published 2"]


@pytest.mark.attestation
def test_tensor_parallel_copies_that_disagree_are_detected(layer):
    pieces = measure(layer, fused_layout(layer, 1, "rows"))
    k = next(piece for piece in pieces if piece.name == "k_proj.weight")
    wrong = Piece(k.name, k.rows, k.cols, k.sum + 1.0, k.projection, k.dtype, k.how)  # a replicated kv head copy
    assert verdict_of(layer, pieces=[*pieces, wrong]) == [
        "k_proj.weight: tensor-parallel copies of rows (0, 16) cols (0, 64) differ"
    ]


def test_pieces_and_fingerprints_cross_process_boundaries_as_plain_values(layer):
    piece = measure(layer, fused_layout(layer, 1, "rows"))[0]
    assert Piece.from_message(piece.to_message()) == piece
    message = fingerprint_state_dict(layer, 4, SEED).to_message()
    assert message == {
        "policy_version": 4,
        "seed": SEED,
        "tensors": {
            "q_proj.weight": [[64, 64], "float32"],
            "k_proj.weight": [[16, 64], "float32"],
            "v_proj.weight": [[16, 64], "float32"],
        },
    }
    assert isinstance(Fingerprints(4, {}).seconds, float)
