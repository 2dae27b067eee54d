"""No process history in the code or the user docs: a reader cannot resolve "seed 003" or "issue 26", so the code and
the docs write the reason itself, or cite the paper or framework by name (AReaL, verl, prime-rl, torchtitan)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PRODUCT = ("rl", "actors", "tasks", "rollouts", "rubrics", "env_types", "tools")
HISTORY = re.compile(r"\bseed \d{3}\b|\bissue \d+", re.IGNORECASE)


def checked_files() -> list[Path]:
    """Product and benchmark modules, tests (this one's examples aside), the docs pages and the README."""
    files = [path for package in (*PRODUCT, "tests") for path in (ROOT / package).rglob("*.py")]
    files.remove(Path(__file__).resolve())
    return [*files, *(ROOT / "benchmarks").glob("*.py"), *(ROOT / "docs").glob("*.md"), ROOT / "README.md"]


def test_no_file_names_a_seed_or_an_issue_number():
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}"
        for path in checked_files()
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if HISTORY.search(line)
    ]
    assert not found, "write the reason, or cite the paper or framework by name:\n" + "\n".join(found)


def test_the_pattern_catches_what_it_is_for():
    assert HISTORY.search("the loss keys `[algorithm]` held before Issue 26")
    assert HISTORY.search("fixed token-count cores (seed 002)")
    assert not HISTORY.search("`--run.seed 1` gives held-out 0.80; meta-pytorch/monarch#2330")
