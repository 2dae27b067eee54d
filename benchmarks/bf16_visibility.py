"""How much of a run's learning a bf16 copy of the weights can see.

Compares the newest checkpoint of a run with the model it started from: the fraction of parameters
that changed in fp32, the fraction whose bf16 rounding changed, and the median relative change.

    .venv/bin/python benchmarks/bf16_visibility.py runs/sum_digits_smollm2_cpu
"""

import argparse
import tempfile
from pathlib import Path

import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from transformers import AutoModelForCausalLM

from rl.assets import resolve_model_path
from rl.config import load_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    run_dir = parser.parse_args().run_dir
    checkpoint = sorted((run_dir / "checkpoints").glob("step_*"))[-1]
    with tempfile.TemporaryDirectory() as tmp:
        dcp_to_torch_save(checkpoint / "trainer", Path(tmp) / "state.pt")
        state = torch.load(Path(tmp) / "state.pt", weights_only=False)
    trained = state.get("model", state)
    model_path = resolve_model_path(load_config(run_dir / "config.toml", {}).model.path)
    initial = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=torch.float32).state_dict()
    total = changed_fp32 = changed_bf16 = 0
    relative = []
    for name, before in initial.items():
        key = next((key for key in trained if key.endswith(name)), None)
        if key is None:
            continue
        after = trained[key].float()
        total += before.numel()
        changed_fp32 += int((after != before).sum())
        changed_bf16 += int((after.bfloat16() != before.bfloat16()).sum())
        relative.append(((after - before).abs() / before.abs().clamp_min(1e-12)).flatten()[::97])  # a strided sample
    print(
        f"{checkpoint}: {total} parameters; changed in fp32 {changed_fp32 / total:.4f}, in bf16 {changed_bf16 / total:.4f}; "
        f"median relative change {torch.cat(relative).median():.2e} (bf16 spacing {2**-8:.1e})"
    )


if __name__ == "__main__":
    main()
