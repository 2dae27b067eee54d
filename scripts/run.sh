#!/usr/bin/env bash
# The main job: set up (first time only), then GRPO on sum_digits with SmolLM2-135M on CPU.
# Extra arguments are config overrides, e.g. scripts/run.sh --run.steps 5
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup_env.sh"
cd "$ROOT"
exec "$ROOT/.venv/bin/rlmesh" train --config "${RLMESH_CONFIG:-configs/sum_digits_smollm2_cpu.toml}" "$@"
