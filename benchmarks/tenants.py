"""K LoRA tenants of one config against its K solo runs one after the other: wall time and sampled tokens per second.

    python benchmarks/tenants.py --tenants 2 --steps 3 [--config configs/sum_digits_smollm2_cpu.toml] [--out DIR]

Tenant i is the config with LoRA (rank 16, alpha 32, lr 2e-4: the main job's LoRA settings), `run.seed` and
`trainer.seed` i, no evaluation. Each solo run and the tenants' run is a whole `rlmesh train` command (start-up
included). Wall time is the command's; tokens are the sampled completion tokens in the runs' `rollouts.jsonl`. It also
says whether each tenant's rollouts are its solo run's byte for byte. Writes DIR/tenants_K.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rl.config import dump_toml, load_config  # noqa: E402

LORA = {
    "trainer.lora.enabled": "true",
    "trainer.lora.rank": "16",
    "trainer.lora.alpha": "32",
    "trainer.lr": "2e-4",
    "run.eval_every": "0",
    "wandb.enabled": "false",
}


def tenant_configs(config: str, tenants: int, steps: int, out: Path) -> list[Path]:
    """Tenant i's config file: `config` with LoRA, seeds i, `steps` steps, named tenant<i>."""
    paths = []
    for index in range(tenants):
        overrides = {**LORA, "run.steps": str(steps), "run.seed": str(index), "trainer.seed": str(index)}
        tenant = load_config(config, {**overrides, "run.name": f"tenant{index}"})
        path = out / f"tenant{index}.toml"
        path.write_text(dump_toml(tenant))
        paths.append(path)
    return paths


def train(args: list[str], output_dir: Path) -> float:
    """Seconds of one `rlmesh train` command, which must exit 0."""
    start = time.perf_counter()
    command = [sys.executable, "-m", "rl.commands.cli", "train", *args, "--run.output_dir", str(output_dir)]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return time.perf_counter() - start


def sampled_tokens(run_dir: Path) -> int:
    records = [json.loads(line) for line in (run_dir / "rollouts.jsonl").read_text().splitlines()]
    return sum(
        len(turn["completion_token_ids"])
        for record in records
        if record["kind"] == "train"
        for turn in record["rollout"]["turns"]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO / "configs" / "sum_digits_smollm2_cpu.toml"))
    parser.add_argument("--tenants", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "tenants-bench")
    args = parser.parse_args()
    out = args.out / f"k{args.tenants}"
    out.mkdir(parents=True, exist_ok=True)
    configs = tenant_configs(args.config, args.tenants, args.steps, out)
    solo = [train(["--config", str(path)], out / "solo") for path in configs]
    together = train([arg for path in configs for arg in ("--config", str(path))], out / "tenants")
    names = [f"tenant{index}" for index in range(args.tenants)]
    solo_tokens = sum(sampled_tokens(out / "solo" / name) for name in names)
    tenant_tokens = sum(sampled_tokens(out / "tenants" / name) for name in names)
    same = [
        (out / "solo" / name / "rollouts.jsonl").read_text() == (out / "tenants" / name / "rollouts.jsonl").read_text()
        for name in names
    ]
    result = {
        "tenants": args.tenants,
        "steps": args.steps,
        "config": args.config,
        "solo_wall_s": solo,
        "solo_total_s": sum(solo),
        "tenants_wall_s": together,
        "speedup": sum(solo) / together,
        "tenants_over_one_solo": together / (sum(solo) / len(solo)),
        "solo_tokens_per_s": solo_tokens / sum(solo),
        "tenants_tokens_per_s": tenant_tokens / together,
        "rollouts_equal_solo": same,
    }
    (args.out / f"tenants_{args.tenants}.json").write_text(json.dumps(result, indent=2))
    print(
        f"| K = {args.tenants} | {sum(solo):.0f} ({', '.join(f'{s:.0f}' for s in solo)}) | {together:.0f} | "
        f"{result['speedup']:.2f}x | {result['tenants_over_one_solo']:.2f}x | {result['solo_tokens_per_s']:.1f} | "
        f"{result['tenants_tokens_per_s']:.1f} | {sum(same)}/{len(same)} |"
    )


if __name__ == "__main__":
    main()
