"""The trainer side of a weight sync on a GPU against its floor: cast on the GPU, then device-to-host into the
shared-memory file the generators map (`rl.weights.shared_file.write`, what `WeightPublisher` runs per parameter).

The floor is the same bytes in one device-to-host copy into pinned memory. The publisher page-locks its files
(`pin_for_device_copies`, as `WeightPublisher` does for GPU weights), so its per-parameter copies must come within
1.5x of the floor; the pageable file (before pinning) is recorded beside it. The bytes that arrive must be the cast
weights exactly.
"""

import time

import torch

from rl.weights.shared_file import file_path, map_file, pin_for_device_copies, plan_layout, view, write
from tests.support.gpu_models import random_qwen3

SHAPE = {  # Qwen3-0.6B's shape (random weights): ~0.6e9 parameters, 1.2 GB in bf16
    "vocab_size": 151936,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
}


def _best(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


def test_the_sync_copy_reaches_the_file_exactly_and_is_measured_against_its_floor(record):
    state_dict = random_qwen3(**SHAPE).cuda().state_dict()
    layout, nbytes = plan_layout(state_dict, torch.bfloat16)
    path = file_path("gpu-suite")
    buffer = map_file(path, nbytes, create=True)
    firsts = {layout[name][0]: name for name in reversed(list(layout))}  # a tied weight once, as the publisher does
    try:

        def sync_copy() -> None:
            with torch.no_grad():
                for name in firsts.values():
                    write(buffer, layout[name], state_dict[name])

        pageable_s = _best(sync_copy)
        pin_for_device_copies(buffer)
        sync_s = _best(sync_copy)
        for name, tensor in state_dict.items():
            assert torch.equal(view(buffer, *layout[name]), tensor.to(torch.bfloat16).cpu()), name
        flat = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda")
        pinned = torch.empty(nbytes // 2, dtype=torch.bfloat16, pin_memory=True)
        floor_s = _best(lambda: pinned.copy_(flat, non_blocking=True))
        cast_s = _best(lambda: [t.to(torch.bfloat16) for t in state_dict.values()])
    finally:
        import os

        os.unlink(path)
    gigabytes = nbytes / 1e9
    record(
        gigabytes=gigabytes,
        sync_copy_s=sync_s,
        sync_copy_pageable_s=pageable_s,
        sync_copy_gb_per_s=gigabytes / sync_s,
        floor_pinned_d2h_s=floor_s,
        floor_gb_per_s=gigabytes / floor_s,
        cast_on_gpu_s=cast_s,
        sync_over_floor=sync_s / floor_s,
    )
    assert sync_s <= 1.5 * floor_s, (sync_s, floor_s)
