"""`rlmesh export RUN_DIR [--step N] --out DIR [--dtype float32|bfloat16]`: a trained policy as a Hugging Face model
folder (`rl.checkpoint.export`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rl.checkpoint.export import EXPORT_DTYPES, adapter_hint, export_checkpoint, run_checkpoint
from rl.console import fail


def add_parser(commands: argparse._SubParsersAction) -> None:
    """The `export` verb's options."""
    parser = commands.add_parser("export", help="write a checkpoint's policy as a Hugging Face model folder")
    parser.add_argument("run_dir", type=Path, help="the run directory, e.g. runs/sum_digits_smollm2_cpu")
    parser.add_argument("--step", type=int, help="the checkpoint's step (default: the newest committed one)")
    parser.add_argument("--out", type=Path, required=True, help="the folder to write (must not exist or be empty)")
    parser.add_argument("--dtype", choices=EXPORT_DTYPES, default="float32", help="weights dtype")


def export_command(args: argparse.Namespace, extra: list[str], argv: list[str]) -> int:
    """The export, and how to load or serve the folder it wrote; 2 when the checkpoint cannot be exported."""
    try:
        exported = export_checkpoint(run_checkpoint(args.run_dir, args.step), args.out, args.dtype)
    except (OSError, ValueError) as exc:
        return fail(f"cannot export: {exc}", 2)
    print(
        f"exported {exported.checkpoint} to {exported.out} ({exported.bytes / 1e6:.1f} MB, {exported.seconds:.1f} s);"
        f" load it with transformers.AutoModelForCausalLM.from_pretrained({str(exported.out)!r})"
        f" or serve it with `vllm serve {exported.out} --dtype {args.dtype}`"
        + (f"; its LoRA adapter alone: {adapter_hint(exported)}" if (exported.out / "adapter").is_dir() else "")
    )
    return 0
