"""The generated configuration reference: committed page current, every field described, the rendering right."""

import difflib
import subprocess
import sys

import pytest
from pydantic import Field

from rl.config.reference import REGENERATE, anchor, render, sections, undescribed
from rl.config.root import Config
from rl.config.section import Section
from tests.support.paths import REPO


def test_committed_reference_is_current():
    committed = (REPO / "docs" / "configuration.md").read_text()
    generated = render()
    diff = "".join(
        list(difflib.unified_diff(committed.splitlines(True), generated.splitlines(True), "committed", "generated"))[
            :40
        ]
    )
    assert committed == generated, (
        f"docs/configuration.md is stale; regenerate it from the repo root:\n    {REGENERATE}\n{diff}"
    )


def test_every_config_field_is_described():
    missing = undescribed()
    assert not missing, (
        f"config fields without a description: {missing}. Write a docstring under each field (what it does, units, "
        f"why the default), then regenerate the reference: {REGENERATE}"
    )


class _Inner(Section):
    """The inner section."""

    depth: int = Field(2, ge=1, le=9)
    """How deep."""


class _Root(Section):
    inner: _Inner = _Inner()
    """Holds the inner section."""
    rows: list[_Inner] = Field(default_factory=list)
    by_name: dict[str, _Inner] = Field(default_factory=dict)
    """Inner sections by name."""
    mode: str | None = None


def test_walk_reaches_lists_and_dicts_of_sections_and_reports_undescribed_fields():
    assert [(doc.path, doc.model, doc.array) for doc in sections(_Root)] == [
        ("", _Root, False),
        ("inner", _Inner, False),
        ("rows", _Inner, True),
        ("by_name.<name>", _Inner, False),
    ]
    assert undescribed(_Root) == ["rows", "mode"]


def test_rendered_tables_carry_type_bounds_default_and_docstring():
    page = render(_Root)
    assert "| `depth` | int ≥ 1, ≤ 9 | `2` | How deep. |" in page
    assert "| `inner` | [`[_root]`]" not in page  # a section links to its own table
    assert "| `inner` | [`[inner]`](#inner) | `{}` | Holds the inner section. |" in page
    assert "| `mode` | str \\| None | `None` |  |" in page
    assert "## `[[rows]]`" in page and "The same fields as [`[inner]`](#inner)." in page


def test_every_section_of_the_config_has_a_table():
    page = render()
    for doc in sections(Config)[1:]:
        assert f"## `{doc.heading}`" in page


def test_anchor_matches_githubs_slugs():
    assert anchor("`[generator.sampling]`") == "generatorsampling"
    assert anchor("`[models.<name>]`") == "modelsname"
    assert anchor("Checkpoints and resume") == "checkpoints-and-resume"
    assert anchor("`[sample_logging]`") == "sample_logging"


@pytest.mark.processes
def test_reference_imports_no_runtime_code():
    code = "import sys, rl.config.reference; print(sorted({'torch', 'vllm', 'monarch'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert result.stdout.strip() == "[]"
