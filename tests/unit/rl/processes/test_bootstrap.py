import subprocess
import sys

import pytest

pytestmark = pytest.mark.processes

LEAVE = "from rl.processes.bootstrap import exit_without_collecting; exit_without_collecting()"
CYCLE = """
{setup}
class Cycle:
    def __del__(self):
        open({mark!r}, "w").close()
cycle = Cycle()
cycle.itself = cycle
del cycle
print("done", flush=True)
"""


@pytest.mark.parametrize(("setup", "collected"), [("", True), (LEAVE, False)])
def test_an_actor_process_leaves_its_heap_to_the_kernel_at_exit(tmp_path, setup, collected):
    """Garbage in a cycle is collected (its finaliser runs) by the interpreter's exit unless the exit leaves it; what
    the process printed before it exits is kept."""
    mark = tmp_path / "collected"
    script = CYCLE.format(setup=setup, mark=str(mark))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout == "done\n"
    assert mark.exists() == collected


def test_a_vllm_process_that_leaves_its_heap_exits_without_reports_of_leaked_bindings():
    out = subprocess.run([sys.executable, "-c", f"{LEAVE}\nimport vllm"], capture_output=True, text=True, check=True)
    assert "leaked" not in out.stderr
