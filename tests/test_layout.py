"""The layout's floors (`tests.floor_plan.FLOORS`): each folder imports only folders on floors below its own (imports
inside functions too), no modules import each other in a circle at import time, and the README's Layout table is the
floor plan's.

Imports are read with `ast`, so the check needs no import of the project.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.floor_plan import FLOORS, PACKAGES, README, ROOT, readme_with_table


def room(module: str) -> str | None:
    """The room of a dotted module name (None: not the project's)."""
    parts = module.split(".")
    if parts[0] not in PACKAGES:
        return None
    if parts[0] != "rl" or len(parts) == 1:
        return parts[0]
    return f"rl/{parts[1]}" if (ROOT / "rl" / parts[1]).is_dir() else f"rl/{parts[1]}.py"


def project_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `path` imports, inside functions too (`from a import b` counts `a.b` when that is a module, else `a`)."""
    found = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(
                f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                for alias in node.names
            )
    return {name for name in found if name in modules}


def test_every_folder_imports_only_floors_below_it():
    floor_of = {room_name: index for index, floor in enumerate(FLOORS) for room_name in floor}
    modules = project_modules()
    unplaced = sorted({room(name) for name in modules} - set(floor_of) - {"rl"})
    assert not unplaced, f"rooms on no floor (add them to FLOORS): {unplaced}"
    upward = []
    for name, path in modules.items():
        source = room(name)
        for target in map(room, imports(path, modules)):
            if source != target and target != "rl" and floor_of[target] >= floor_of[source]:
                upward.append(
                    f"{path.relative_to(ROOT)}: {source} (floor {floor_of[source]}) imports {target} (floor {floor_of[target]})"
                )
    assert not upward, "imports that do not go down a floor:\n" + "\n".join(sorted(upward))


def test_the_config_imports_no_runtime():
    """`rl.config` is a floor of pure pydantic: the checks that need runtime code are `rl.loop.resolve`'s."""
    modules = project_modules()
    outside = {
        f"{path.relative_to(ROOT)} imports {target}"
        for name, path in modules.items()
        if room(name) == "rl/config"
        for target in imports(path, modules)
        if room(target) != "rl/config"
    }
    assert not outside, sorted(outside)


def test_no_modules_import_each_other_in_a_circle():
    """Function-level imports included: one defers a heavy import (torch), it never breaks a circle."""
    modules = project_modules()
    graph = {name: imports(path, modules) - {name} for name, path in modules.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                circles.append(
                    " -> ".join([*path[path.index(target) :], name, target])
                    if target in path
                    else f"{name} -> {target}"
                )
            elif target not in state:
                visit(target, [*path, name])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
    assert not circles, "modules that import each other in a circle:\n" + "\n".join(circles)


def test_the_training_loop_reads_like_its_algorithm():
    """`Controller.train()` is the GRPO loop a reader follows: validate, then batch → step → end of step, in at most 35
    lines; its plumbing lives below it, in the `rl/loop/` modules it calls in one line."""
    source = (ROOT / "rl" / "loop" / "controller.py").read_text()
    train = next(
        node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.AsyncFunctionDef) and node.name == "train"
    )
    assert train.end_lineno - train.lineno + 1 <= 35


def is_own(node: ast.Attribute) -> bool:
    """`self._name` or `cls._name`: an object's own attribute."""
    return isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")


def private_names_defined(tree: ast.AST) -> set[str]:
    """The `_private` names a module defines: module and class attributes, methods, and `self._name` assignments."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and is_own(node):
            names.add(node.attr)
    return {name for name in names if name.startswith("_") and not name.startswith("__")}


def test_no_module_reads_another_modules_private_names():
    """A `_name` is its module's own: another module reads it only through a public name (a property, a method, a
    `typing.Protocol` it is typed by), so a reader sees every way in. Private names of other libraries are not counted."""
    modules = project_modules()
    trees = {name: ast.parse(path.read_text()) for name, path in modules.items()}
    defined = {name: private_names_defined(tree) for name, tree in trees.items()}
    everywhere = set().union(*defined.values())
    reads = []
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in modules:
                reads += [
                    f"{modules[name].relative_to(ROOT)}:{node.lineno}: imports {node.module}.{alias.name}"
                    for alias in node.names
                    if alias.name.startswith("_") and not alias.name.startswith("__")
                ]
            elif isinstance(node, ast.Attribute) and node.attr in everywhere - defined[name] and not is_own(node):
                reads.append(f"{modules[name].relative_to(ROOT)}:{node.lineno}: uses {ast.unparse(node)}")
    assert not reads, "private names used from another module:\n" + "\n".join(reads)


def test_tests_mirror_the_packages():
    """No test module lies flat in `tests/` but this one: each lives in the folder of what it covers."""
    assert sorted(path.name for path in (ROOT / "tests").glob("test_*.py")) == ["test_layout.py"]


def test_the_readmes_layout_table_is_the_floor_plans():
    """The table is written by `python -m tests.floor_plan` from the floors and each module's docstring."""
    readme = README.read_text()
    assert readme == readme_with_table(readme), "stale: run PYTHONPATH=$PWD .venv/bin/python -m tests.floor_plan"


def test_benchmarks_and_the_testbed_import_no_tests():
    """Benchmarks and the one-machine cluster stand on their own: what they share with the tests lives in `testbed/`."""
    modules = {
        f"tests.{'.'.join(path.relative_to(ROOT / 'tests').with_suffix('').parts)}": path
        for path in (ROOT / "tests").rglob("*.py")
    }
    modules["tests"] = ROOT / "tests" / "__init__.py"
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for folder in ("benchmarks", "testbed")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for name in sorted(imports(path, modules))
    ]
    assert not offenders, "\n".join(offenders)
