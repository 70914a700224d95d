"""docs/README.md is the index of the user docs: every page in docs/ (and docs/reproducing/)
is linked from it, every link in it resolves, and the top-level README links it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
INDEX = DOCS / "README.md"
LINK = re.compile(r"\]\(([^)#\s]+)(#[^)\s]*)?\)")


def _links(path: Path) -> set[Path]:
    return {
        (path.parent / m.group(1)).resolve()
        for m in LINK.finditer(path.read_text())
        if not re.match(r"[a-z]+:", m.group(1))  # not http:, mailto:, ...
    }


def test_every_doc_is_in_the_index():
    pages = {p.resolve() for p in [*DOCS.glob("*.md"), *DOCS.glob("reproducing/*.md")]}
    missing = sorted(str(p.relative_to(ROOT)) for p in pages - _links(INDEX) - {INDEX})
    assert not missing, f"not linked from docs/README.md: {missing}"


def test_every_link_in_the_index_resolves():
    broken = sorted(str(p) for p in _links(INDEX) if not p.exists())
    assert not broken, broken


def test_each_entry_says_when_to_read_it():
    entries = [line for line in INDEX.read_text().splitlines() if line.startswith("- [")]
    assert entries
    for line in entries:
        assert re.match(r"- \[[^]]+\]\([^)]+\): \S", line), line


def test_the_readme_links_the_index():
    assert (DOCS / "README.md").resolve() in _links(ROOT / "README.md")
