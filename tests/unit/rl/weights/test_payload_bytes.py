"""`weight_sync/bytes`: what one published version carries, counted by hand."""

import torch

from rl.weights.sync import payload_bytes


def test_tied_tensors_count_once_and_floats_travel_in_the_wire_dtype():
    embedding = torch.zeros(10, 4)
    state = {
        "embed": embedding,
        "lm_head": embedding,
        "norm": torch.ones(4),
        "steps": torch.zeros(3, dtype=torch.int64),
    }
    assert payload_bytes(state, torch.float32) == (40 + 4) * 4 + 3 * 8
    assert payload_bytes(state, torch.bfloat16) == (40 + 4) * 2 + 3 * 8
