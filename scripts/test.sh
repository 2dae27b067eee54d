#!/usr/bin/env bash
# The test suite: set up (first time only), build the offline model assets, run pytest.
# With no arguments: every test in two worker processes (pytest-xdist, a module at a time per worker). An end-to-end
# run keeps ~1.5 cores busy on average (imports, waits on deadlines and restarts), so a unit module or a second run
# fills the rest. With arguments: one pytest run with them, e.g. scripts/test.sh -m "not e2e",
# scripts/test.sh tests/e2e/test_resume.py, scripts/test.sh -n 2 -m e2e.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup_env.sh"
cd "$ROOT"
"$ROOT/.venv/bin/python" scripts/build_assets.py
if [ $# -gt 0 ]; then
    exec "$ROOT/.venv/bin/python" -m pytest -q "$@"
fi
exec "$ROOT/.venv/bin/python" -m pytest -q -n 2 --dist loadfile
