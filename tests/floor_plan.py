"""The layout's floor plan: the rooms (a folder of `rl/`, a module directly in `rl/`, a top-level package) floor by
floor, which tests/test_layout.py asserts, and the README's Layout table written from it.

    PYTHONPATH=$PWD .venv/bin/python -m tests.floor_plan          # rewrite the table in README.md

The table lists the rooms from the top floor down, each with the first sentence of its docstring and its modules,
each with the first sentence of its own; tests/test_layout.py fails when the README's table is stale.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PACKAGES = ("rl", "actors", "tasks", "rollouts", "rubrics", "env_types", "tools")
FLOORS = [  # the ground first; a folder of `rl/` and a module directly in `rl/` are each a room
    {"rl/console.py"},  # the one channel for warnings and status lines to the user
    {"rl/components.py", "rl/assets.py", "rl/gpus.py"},
    {"rl/precision.py"},
    {"rl/config"},  # the typed config: imports nothing of the project's but itself (tests/test_layout.py)
    {"rl/packing"},  # training samples packed into rows, and the prefix-tree layout over them
    {"env_types"},  # what a task author's environment is: messages in, messages out; messages <-> tokens
    {"rollouts"},  # the records of a rollout and how one is driven and fanned out
    {"tools", "rubrics", "rl/services", "rl/algorithms"},
    {"rl/metrics", "rl/processes", "tasks"},
    {"rl/training"},  # the trainer's step statistics are the metrics system's
    {"rl/checkpoint"},  # a resume repairs the logs; the export of a LoRA run rebuilds the trainer's adapters
    {"rl/weights"},
    {"actors"},
    {"rl/loop"},
    {"rl/commands"},  # the `rlmesh` verbs: the parser and each verb's glue
]
BEGIN = (
    "<!-- layout: written by `python -m tests.floor_plan` from tests/floor_plan.py's FLOORS; do not edit by hand -->"
)
END = "<!-- layout: end -->"
LONG = 140
"""Characters past which a first sentence is cut at its colon."""


def first_sentence(path: Path) -> str:
    """The first sentence of a module's docstring, on one line ('' without one)."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    paragraph = " ".join(doc.split("\n\n")[0].split())
    sentence = re.split(r"(?<=\.)\s", paragraph, maxsplit=1)[0]
    if len(sentence) > LONG and ": " in sentence[:LONG]:  # a long one up to its colon: what comes after details it
        sentence = sentence[: sentence.index(": ")]
    return sentence.rstrip(".").replace("|", "\\|")


def room_path(room: str) -> Path:
    return ROOT / room


def modules_of(room: str) -> list[Path]:
    """A folder's modules, subfolders included, `__init__` left out (a flat module is a room of its own: none)."""
    path = room_path(room)
    if path.suffix == ".py":
        return []
    return sorted(module for module in path.rglob("*.py") if module.name != "__init__.py")


def table() -> str:
    """The Layout table, top floor first."""
    rows = ["| room | what it is | modules |", "|---|---|---|"]
    for floor in reversed(FLOORS):
        for room in sorted(floor):
            path = room_path(room)
            about = first_sentence(path if path.suffix == ".py" else path / "__init__.py")
            modules = "<br>".join(
                f"`{module.relative_to(path).with_suffix('').as_posix()}`: {first_sentence(module)}"
                for module in modules_of(room)
            )
            name = f"`{room}/`" if path.is_dir() else f"`{room}`"
            rows.append(f"| {name} | {about} | {modules} |")
    return "\n".join(rows)


def readme_with_table(readme: str) -> str:
    """`readme` with its table between the markers written anew."""
    start, end = readme.index(BEGIN) + len(BEGIN), readme.index(END)
    return readme[:start] + "\n" + table() + "\n" + readme[end:]


if __name__ == "__main__":
    README.write_text(readme_with_table(README.read_text()))
