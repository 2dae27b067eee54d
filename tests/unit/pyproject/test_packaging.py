"""pyproject.toml reads without a setuptools deprecation: `pip install -e .` prints none (a deprecated key prints ~30 lines);
the venv scripts/setup_env.sh makes is byte-compiled."""

import importlib.util
import sysconfig
import warnings
from pathlib import Path

from setuptools.config.pyprojecttoml import apply_configuration
from setuptools.dist import Distribution
from setuptools.warnings import SetuptoolsWarning

from tests.support.paths import REPO


def test_pyproject_applies_without_setuptools_warnings():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), REPO / "pyproject.toml")
    assert [str(w.message) for w in caught if issubclass(w.category, SetuptoolsWarning)] == []
    assert dist.metadata.license_expression == "Apache-2.0" and dist.metadata.name == "rlmesh"


def compiles(source: Path) -> bool:
    """Whether this Python compiles `source` (torch ships a few modules for newer Pythons only)."""
    try:
        compile(source.read_bytes(), str(source), "exec")
    except SyntaxError:
        return False
    return True


def test_the_venv_is_byte_compiled():
    """scripts/setup_env.sh compiles the venv: with PYTHONDONTWRITEBYTECODE set (as on the project's machines) Python
    caches nothing it compiles at import, so every actor process would compile vLLM, torch and the rest again."""
    purelib = Path(sysconfig.get_path("purelib"))
    uncompiled = [
        str(source.relative_to(purelib))
        for package in ("torch", "vllm", "transformers", "monarch", "torchstore", "tensordict", "renderers")
        for source in (purelib / package).rglob("*.py")
        if not Path(importlib.util.cache_from_source(str(source))).exists() and compiles(source)
    ]
    assert uncompiled == [], f"{len(uncompiled)} modules without bytecode, e.g. {uncompiled[:5]}"
