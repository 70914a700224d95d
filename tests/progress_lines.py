"""The training job's progress lines read back from a log (jobs/training/progress.py)."""

from __future__ import annotations

import re

LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (step=\S+( [\w/]+=\S+)+)$")
FIELDS = ("step", "steps", "tokens", "loss", "lr", "tokens/s", "elapsed", "eta")


def seconds(text: str) -> float:
    """12.3s, 4m05s, 2h07m -> seconds."""
    if m := re.fullmatch(r"(\d+)h(\d\d)m", text):
        return int(m[1]) * 3600 + int(m[2]) * 60
    if m := re.fullmatch(r"(\d+)m(\d\d)s", text):
        return int(m[1]) * 60 + int(m[2])
    return float(text.removesuffix("s"))


def progress_lines(log: str) -> list[dict[str, float]]:
    """Every progress line of `log`, its fields as numbers (steps: the total; mfu in %)."""
    out = []
    for line in log.splitlines():
        if not (m := LINE.match(line)):
            continue
        fields = dict(pair.split("=", 1) for pair in m[1].split())
        step, steps = fields.pop("step").split("/")
        row = {"step": int(step), "steps": int(steps)}
        for key, value in fields.items():
            if key in ("elapsed", "eta"):
                row[key] = seconds(value)
            else:
                row[key] = float(value.removesuffix("%"))
        out.append(row)
    return out
