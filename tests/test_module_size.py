"""Small modules with one job (docs/architecture.md, 'Packages'): a module of the package
longer than LIMIT lines says at its top why it is one module ("Why one module: ...")."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("cli", "orchestrator", "analysis", "jobs", "models", "kernels", "contract")
LIMIT = 400
REASON = "Why one module:"


def long_without_reason(root: Path = ROOT, limit: int = LIMIT) -> list[str]:
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            text = path.read_text()
            lines = len(text.splitlines())
            if lines > limit and REASON not in (ast.get_docstring(ast.parse(text)) or ""):
                found.append(f"{path.relative_to(root)}: {lines} lines")
    return found


def test_a_long_module_says_why_it_is_one():
    found = long_without_reason()
    assert not found, f"over {LIMIT} lines with no '{REASON}' in the docstring:\n" + "\n".join(
        found
    )


def test_the_check_sees_a_long_module(tmp_path: Path):
    (tmp_path / "models").mkdir()
    body = "x = 1\n" * 30
    (tmp_path / "models" / "long.py").write_text('"""Long."""\n' + body)
    (tmp_path / "models" / "said.py").write_text(f'"""Long.\n\n{REASON} it is."""\n' + body)
    assert long_without_reason(tmp_path, limit=20) == ["models/long.py: 31 lines"]
