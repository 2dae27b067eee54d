"""Delta weight sync's device work at Llama-3-8B's shapes (bf16): change detection + extraction
(`rl.weights.delta.encode_block`: the bitwise compare, the count, offsets or bitmap and values, then the payload to the
host) against the device's own copy bandwidth (goal: at least half of it, reading the new and the old copy; recorded,
not asserted, until a GPU has measured it), and applying the patch into a resident copy on the device. The patched
copy must be the new weights bit for bit (`tests.support.delta_bench`, whose CPU path a unit test runs at a reduced
size)."""

import pytest

from tests.support.delta_bench import measure

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("fraction", [0.01, 0.12])
def test_change_extraction_and_patch_apply_against_the_copy_bandwidth(record, fraction):
    """0.01: an RL learning rate's bf16 changes; 0.12: lr 2e-5 on the main job after 14 steps (bitmap territory)."""
    measured = measure("cuda", layers=4, fraction=fraction)  # the embedding + 4 of the 32 layers: ~4.5 GB of bf16
    record(**measured)
    assert measured["payload_fraction"] < 0.35
