#!/usr/bin/env bash
# The test suite: set up (first time only), build the offline model assets, run pytest.
# Extra arguments go to pytest, e.g. scripts/test.sh -m "not e2e"
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup_env.sh"
cd "$ROOT"
"$ROOT/.venv/bin/python" scripts/build_assets.py
exec "$ROOT/.venv/bin/python" -m pytest -q "$@"
