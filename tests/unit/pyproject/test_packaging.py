"""pyproject.toml reads without a setuptools deprecation: `pip install -e .` prints none (issue 33 measured ~30 lines)."""

import warnings

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
