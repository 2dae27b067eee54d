#!/usr/bin/env bash
# The test suite: set up (first time only), build the offline model assets, run pytest.
# With no arguments: the unit and adversarial tests in two worker processes (pytest-xdist, a module at a time per
# worker), then the end-to-end tests in one process (each e2e run already keeps both cores busy; two at once only
# slow each other down and miss their deadlines). With arguments: one pytest run with them, e.g.
# scripts/test.sh -m "not e2e", scripts/test.sh tests/e2e/test_resume.py, scripts/test.sh -n 2 -m "not e2e".
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup_env.sh"
cd "$ROOT"
"$ROOT/.venv/bin/python" scripts/build_assets.py
if [ $# -gt 0 ]; then
    exec "$ROOT/.venv/bin/python" -m pytest -q "$@"
fi
unit=0
"$ROOT/.venv/bin/python" -m pytest -q -n 2 --dist loadfile -m "not e2e" || unit=$?
e2e=0
"$ROOT/.venv/bin/python" -m pytest -q -m e2e || e2e=$?
echo "unit and adversarial tests: exit $unit; end-to-end tests: exit $e2e" >&2
exit $((unit > e2e ? unit : e2e))
