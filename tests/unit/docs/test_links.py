"""Every relative link of the README, the docs and the measurements resolves: the file exists and, for a
markdown file, the `#anchor` is one of its headings (GitHub's slugs). Every docs page is on the README's map."""

import re
from pathlib import Path

import pytest

from rl.config.reference import anchor
from tests.support.paths import REPO

PAGES = sorted([REPO / "README.md", REPO / "benchmarks" / "README.md", *(REPO / "docs").glob("*.md")])

_FENCE = re.compile(r"^(```|~~~).*?^\1", flags=re.S | re.M)
_CODE_SPAN = re.compile(r"(`+).+?\1", flags=re.S)
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", flags=re.M)


def _prose(text: str) -> str:
    """The text without fenced code blocks and code spans (their brackets are not links)."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings (a repeated heading gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    found = set()
    for heading in _HEADING.findall(_FENCE.sub("", page.read_text())):
        slug = anchor(heading)
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def links(page: Path) -> list[str]:
    return _LINK.findall(_prose(page.read_text()))


def broken_links(page: Path, root: Path) -> list[str]:
    """Each relative link of `page` that does not resolve, with why."""
    broken = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check
            continue
        path_part, _, fragment = target.partition("#")
        path = (page.parent / path_part).resolve() if path_part else page
        if not path.is_relative_to(root.resolve()):
            broken.append(f"{target}: outside the repository")
        elif not path.exists():
            broken.append(f"{target}: no such file")
        elif fragment and path.suffix == ".md" and fragment not in anchors(path):
            broken.append(f"{target}: {path.name} has no heading with anchor #{fragment}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPO)))
def test_relative_links_resolve(page):
    broken = broken_links(page, REPO)
    assert not broken, f"{page.relative_to(REPO)}: broken links:\n  " + "\n  ".join(broken)


def test_every_docs_page_is_on_the_readmes_map():
    mapped = {target.partition("#")[0] for target in links(REPO / "README.md")}
    missing = [f"docs/{page.name}" for page in (REPO / "docs").glob("*.md") if f"docs/{page.name}" not in mapped]
    assert not missing, f"add these pages to the Documentation table of README.md: {missing}"


def test_the_checker_finds_missing_files_and_anchors_and_skips_code(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# Title\n\n## The `[model]` section\n\n## Repeated\n\n## Repeated\n")
    page = tmp_path / "a.md"
    page.write_text(
        "[ok](docs/b.md) [ok](docs/b.md#title) [ok](docs/b.md#the-model-section) [ok](docs/b.md#repeated-1)\n"
        "[self](#local) [web](https://example.com/x#y) `[not a link](nowhere.md)`\n"
        "```\n[not a link](nowhere.md)\n```\n"
        "[gone](docs/c.md) [bad anchor](docs/b.md#nope) [escape](../../etc/passwd)\n\n## Local\n"
    )
    assert broken_links(page, tmp_path) == [
        "docs/c.md: no such file",
        "docs/b.md#nope: b.md has no heading with anchor #nope",
        "../../etc/passwd: outside the repository",
    ]
