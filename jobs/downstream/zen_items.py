"""The items of the shipped task `scalelab_zen` (tasks/zen.jsonl), built from text every
Python install ships: the Zen of Python (the standard library's `this` module).

Each aphorism of four or more words is cut after a third and after two thirds of its words;
the model chooses the true rest among it and three rests of other aphorisms (a fixed seed
picks them and the order). `python -m scalelab.jobs.downstream.zen_items` rewrites the file;
tests/jobs/downstream/test_tasks.py checks the shipped file is what this builds."""

from __future__ import annotations

import codecs
import json
import random
from pathlib import Path

DATA = Path(__file__).parent / "tasks" / "zen.jsonl"
N_CHOICES = 4


def aphorisms() -> list[str]:
    import this  # noqa: F401  (prints the Zen once at import; its text is `this.s`, rot13)

    text = codecs.decode(this.s, "rot13")
    lines = [line.strip() for line in text.splitlines()[2:]]  # after the title
    return [line for line in lines if len(line.split()) >= 4]


def items(seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    cuts = []
    for i, line in enumerate(aphorisms()):
        words = line.split()
        for cut in sorted({max(1, len(words) // 3), max(2, 2 * len(words) // 3)}):
            cuts.append((i, " ".join(words[:cut]), " ".join(words[cut:])))
    out = []
    for i, context, rest in cuts:
        others = sorted({r for j, _, r in cuts if j != i and r != rest})
        choices = [rest, *rng.sample(others, N_CHOICES - 1)]
        rng.shuffle(choices)
        out.append({"context": context, "choices": choices, "label": choices.index(rest)})
    return out


def render(rows: list[dict]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


if __name__ == "__main__":
    DATA.write_text(render(items()))
    print(f"wrote {len(items())} items to {DATA}")
