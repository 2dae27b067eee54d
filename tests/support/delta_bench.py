"""Delta sync's device work on Llama-3-8B-shaped bf16 tensors, timed against the device's own copy bandwidth: change
detection + extraction (`rl.weights.delta.encode_block`: compare the bits, count, take offsets or a bitmap and the
values, bring them to the host) and applying the parsed patch into a resident copy on the device
(`rl.weights.delta.apply_record`). Used by the GPU suite (tests/gpu/test_delta_sync.py) at full size and by a unit
test on the CPU at a reduced size (`scale` divides every dimension), which checks the same path end to end."""

from __future__ import annotations

import time

import torch

from rl.weights.delta import TensorEntry, apply_record, encode_block, parse_stream

LLAMA3_8B = {"vocab": 128256, "hidden": 4096, "intermediate": 14336, "kv": 1024}


def shapes(layers: int, scale: int = 1) -> dict[str, tuple[int, int]]:
    """The embedding and `layers` decoder layers' matrices of Llama-3-8B, every dimension divided by `scale`."""
    vocab, hidden, inter, kv = (LLAMA3_8B[key] // scale for key in ("vocab", "hidden", "intermediate", "kv"))
    out = {"embed_tokens": (vocab, hidden)}
    for layer in range(layers):
        out |= {
            f"{layer}.q_proj": (hidden, hidden),
            f"{layer}.k_proj": (kv, hidden),
            f"{layer}.v_proj": (kv, hidden),
            f"{layer}.o_proj": (hidden, hidden),
            f"{layer}.gate_proj": (inter, hidden),
            f"{layer}.up_proj": (inter, hidden),
            f"{layer}.down_proj": (hidden, inter),
        }
    return out


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best(fn, device: torch.device, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return min(times)


def measure(device: str, layers: int, fraction: float, scale: int = 1, repeats: int = 3) -> dict[str, float]:
    """Seconds and GB/s of extraction and apply at `fraction` of elements changed (each by one bf16 ulp, at random
    places), and the device's copy bandwidth (read + write of the same bytes); asserts the patched copy is the new
    weights bit for bit."""
    device_ = torch.device(device)
    generator = torch.Generator(device=device_).manual_seed(0)
    old, new = {}, {}
    for name, shape in shapes(layers, scale).items():
        old[name] = (torch.randn(shape, generator=generator, device=device_) * 0.02).to(torch.bfloat16).view(-1)
        moved = torch.rand(shape, generator=generator, device=device_).view(-1) < fraction
        new[name] = (old[name].view(torch.int16) + moved.to(torch.int16)).view(torch.bfloat16)
    nbytes = sum(tensor.numel() * 2 for tensor in old.values())
    entries = tuple(TensorEntry((name,), tuple(tensor.shape), "bfloat16") for name, tensor in old.items())
    encoded: list[list[torch.Tensor]] = []

    def extract() -> None:
        encoded.clear()
        encoded.extend(encode_block(index, 0, new[name], old[name])[0] for index, name in enumerate(old))

    extract_s = _best(extract, device_, repeats)
    payload = torch.cat([piece for pieces in encoded for piece in pieces])
    records = [
        type(record)(
            record.tensor, record.kind, record.start, record.length, record.values.to(device_),
            None if record.where is None else record.where.to(device_),
        )
        for record in parse_stream(payload, entries)
    ]  # fmt: skip
    resident = {name: tensor.clone() for name, tensor in old.items()}
    names = list(old)

    def apply() -> None:
        for record in records:
            apply_record(resident[names[record.tensor]], record)

    apply_s = _best(apply, device_, repeats)
    for name in names:
        assert torch.equal(resident[name].view(torch.int16), new[name].view(torch.int16)), name
    flat = torch.empty(nbytes, dtype=torch.uint8, device=device_)
    copy_s = _best(lambda: torch.empty_like(flat).copy_(flat), device_, repeats)
    return {
        "gigabytes": nbytes / 1e9,
        "changed_fraction": fraction,
        "payload_fraction": payload.numel() / nbytes,
        "extract_s": extract_s,
        "extract_read_gb_s": 2 * nbytes / extract_s / 1e9,
        "apply_s": apply_s,
        "copy_gb_s": 2 * nbytes / copy_s / 1e9,
        "extract_over_copy": (2 * nbytes / extract_s) / (2 * nbytes / copy_s),
    }
