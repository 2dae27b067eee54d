#!/usr/bin/env bash
# The test suite: set up (first time only), build the offline model assets, run pytest.
# With no arguments: every test in two worker processes (pytest-xdist, a file at a time per worker; RLMESH_TEST_WORKERS
# sets the number). An end-to-end run keeps ~1.2 cores busy on average (waits on deadlines, restarts and stops), so
# the other worker fills the rest; a third made the heaviest runs slower than the CPU it saved on 2 cores
# (benchmarks/README.md, "The test suite").
# With arguments: one pytest run with them, e.g. scripts/test.sh -m "not processes" (in-process tests only),
# scripts/test.sh tests/e2e/test_resume.py, scripts/test.sh -n 2 -m e2e.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup_env.sh"
cd "$ROOT"
"$ROOT/.venv/bin/python" scripts/build_assets.py
if [ $# -gt 0 ]; then
    exec "$ROOT/.venv/bin/python" -m pytest -q "$@"
fi
exec "$ROOT/.venv/bin/python" -m pytest -q -n "${RLMESH_TEST_WORKERS:-2}" --dist loadfile
