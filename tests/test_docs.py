"""The docs show code that runs: the 'Add a mechanism' walkthrough of docs/architecture.md is
the test-only mechanism that tests/orchestrator/test_mechanism_walkthrough.py runs."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_walkthrough_is_the_test_mechanism():
    doc = (ROOT / "docs" / "architecture.md").read_text()
    section = doc.split("### Add a mechanism", 1)[1]
    block = section.split("```python\n", 1)[1].split("```\n", 1)[0]
    assert block == (ROOT / "tests" / "support" / "rezero_mechanism.py").read_text()
