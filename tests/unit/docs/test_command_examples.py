"""The docs' `rlmesh eval` / `rlmesh export` examples on the main job's run directory name a step that run commits."""

import re

import pytest

from rl.config import load_config
from tests.support.paths import REPO

MAIN_JOB = "sum_digits_smollm2_cpu"
PAGES = [REPO / "README.md", *(REPO / "docs").glob("*.md")]


def committed_steps(config) -> set[int]:
    """The steps whose checkpoints the run keeps at its end: the regular ones (every `every_steps`) and the final one,
    the newest `keep` of them."""
    steps = config.run.steps
    every = config.checkpoint.every_steps
    written = {step for step in range(every, steps + 1, every)} if every else set()
    written |= {steps} if config.checkpoint.final != "none" else set()
    return set(sorted(written)[-config.checkpoint.keep :])


def examples() -> list[tuple[str, int]]:
    pattern = re.compile(rf"rlmesh\s+(?:eval|export)\s+runs/{MAIN_JOB}\s+--step\s+(\d+)")
    return [(page.name, int(step)) for page in PAGES for step in pattern.findall(page.read_text())]


def test_the_examples_exist():
    assert examples(), "no `rlmesh eval|export runs/<main job> --step N` example left in the docs"


@pytest.mark.parametrize(("page", "step"), examples())
def test_an_examples_step_is_one_the_main_job_commits(page, step):
    committed = committed_steps(load_config(REPO / "configs" / f"{MAIN_JOB}.toml"))
    assert step in committed, f"{page}: --step {step}, but the main job commits only steps {sorted(committed)}"
