"""The docs show code that runs: the 'Add a mechanism' walkthrough of docs/architecture.md is
the test-only mechanism that tests/orchestrator/test_mechanism_walkthrough.py runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_walkthrough_is_the_test_mechanism():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc.split("### Add a mechanism", 1)[1]
    block = section.split("```python\n", 1)[1].split("```\n", 1)[0]
    assert block == (ROOT / "tests" / "support" / "rezero_mechanism.py").read_text()


DEVELOPMENT_LOG = re.compile(
    r"this machine|\bissues? #?\d+|\bmain at\b|\bcommit [0-9a-f]{7,40}\b|`(?=[0-9]*[a-f])[0-9a-f]{7,40}`",
    re.IGNORECASE,
)


def _prose(text: str) -> list[tuple[int, str]]:
    """The lines of a Markdown text outside fenced blocks (a program's output may say
    'this machine': it speaks of the reader's)."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced:
            out.append((n, line))
    return out


def test_user_docs_read_as_the_users_not_as_a_development_log():
    """No 'this machine', issue numbers or commit hashes in what users read; measurements
    and their history live in docs/benchmarks.md, which may name them."""
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    found = [
        f"{path.relative_to(ROOT)}:{n}: {m.group(0)!r}"
        for path in docs
        if path.name != "benchmarks.md"
        for n, line in _prose(path.read_text())
        for m in [DEVELOPMENT_LOG.search(line)]
        if m
    ]
    assert not found, "\n".join(found)
