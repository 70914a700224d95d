"""Shell completion of sweep files: `scalelab submit sw<TAB>` offers the sweep YAMLs and
the folders on the way to them (typer's completion, `scalelab --install-completion`)."""

from __future__ import annotations

from pathlib import Path

SWEEP_SUFFIXES = (".yaml", ".yml")


def sweep_files(incomplete: str) -> list[str]:
    """The YAML files and folders whose path starts with `incomplete` (hidden ones only when
    asked for by a leading dot), folders with a trailing '/' so completion goes on inside."""
    folder, _, prefix = incomplete.rpartition("/")
    base = Path(folder or ("/" if incomplete.startswith("/") else "."))
    try:
        entries = sorted(base.iterdir())
    except OSError:
        return []
    found = []
    for entry in entries:
        name = entry.name
        if not name.startswith(prefix) or (name.startswith(".") and not prefix.startswith(".")):
            continue
        shown = f"{folder}/{name}" if "/" in incomplete else name
        if entry.is_dir():
            found.append(shown + "/")
        elif entry.suffix in SWEEP_SUFFIXES:
            found.append(shown)
    return found
