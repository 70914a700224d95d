"""Seeded fuzz of what `results import` reads: hostile CSV, JSON Lines and Parquet contents
(random bytes, deep nesting, numbers past every range, wrong types, control characters,
BOMs, empty and header-only files, ragged rows, broken Parquet) through the real CLI, in
this process (click's CliRunner on the typer app's command). For every case:
- no traceback, no signal, an answer within PER_CASE_S seconds;
- exit 0 (imported), or exit 2 with exactly one line starting `error: ` (a list of bad
  rows follows it, each naming the file);
- what was imported is sane: every N and D a count >= 1, C finite, a finite loss or a
  score, no control character in a name, variant or size.
The counts are printed and recorded in docs/reliability.md.
"""

from __future__ import annotations

import codecs
import json
import math
import os
import random
import time
from collections import Counter
from pathlib import Path

import pytest
from faults.input_cli import answered, deadline, scalelab

from scalelab.analysis.results import tables

SEED = 4242
CASES = int(os.environ.get("SCALELAB_IMPORT_FUZZ_CASES", "200"))
PER_CASE_S = 10.0
COLUMNS = ("N", "tokens", "flops", "loss", "seed", "variant", "size", "name", "budget",
           "acc_piqa", "eval_arc_bpb", "params", "D", "junk")  # fmt: skip
NUMBERS = ("1e8", "2e9", "3.1", "0", "-1", "0.4", "1e400", "-1e400", "nan", "inf", "-inf",
           "NaN", "Infinity", "9" * 30, "1e18", "1e19", "-0", "1_000", "0x10", "1e-400",
           "9223372036854775808", "2.5e9", "", " ", "null", "true", "[1]", "{}", "1,5",
           "١٢٣", "1e8 ", "+3")  # fmt: skip
DEFAULTS = {"seed": "0", "variant": "dense", "size": "", "name": "", "budget": "1e18",
            "acc_piqa": "0.5", "eval_arc_bpb": "0.9", "junk": "x"}  # fmt: skip
TEXTS = ("dense", "\x1b[2J", "\x1b]0;title\x07", "a\u202eb", "λ名🦜", "x" * 300, "\r", "\t",
         "\x00", '"', "'", ",", "\\", "\ufeff", "")  # fmt: skip


def value(rng: random.Random) -> str:
    return rng.choice(NUMBERS) if rng.random() < 0.7 else rng.choice(TEXTS)


def ladder(rng: random.Random) -> tuple[list[str], list[list[str]]]:
    """A small ladder (columns, rows of text), mutated here and there."""
    names = rng.sample(COLUMNS, rng.randrange(1, 8))
    if rng.random() < 0.7:
        names = ["N", "tokens", "loss", *[c for c in names if c in DEFAULTS]]
    if rng.random() < 0.1:
        names.append(rng.choice((*names, "\x1b[31mred", "", "n", "eval_\x07_acc")))
    rows = []
    for _ in range(rng.choice((0, 1, 2, 5, 30))):
        row = [str(10 ** rng.randrange(6, 10)), str(2 * 10 ** rng.randrange(8, 11)),
               f"{2 + rng.random():.4f}"] + [DEFAULTS.get(c, "1") for c in names[3:]]  # fmt: skip
        row = row[: len(names)]
        for k in range(len(row)):
            if rng.random() < 0.04:
                row[k] = value(rng)
        if rng.random() < 0.05:
            row = row[: rng.randrange(len(row) + 1)] + ["extra"] * rng.randrange(2)
        rows.append(row)
    if rows and rng.random() < 0.1:
        rows.append(list(rows[0]))  # a repeat
    return names, rows


def csv_bytes(rng: random.Random) -> bytes:
    names, rows = ladder(rng)

    def cell(s: str) -> str:
        return f'"{s.replace(chr(34), chr(34) * 2)}"' if any(c in s for c in ',"\n\r') else s

    text = "\n".join(",".join(map(cell, r)) for r in [names, *rows]) + "\n"
    pick = rng.randrange(12)
    if pick == 0:
        return codecs.BOM_UTF8 + text.encode()
    if pick == 1:
        return text.encode("utf-16")
    if pick == 2:
        return text.replace("\n", "\r\n").encode()
    if pick == 3:
        return text.split("\n", 1)[0].encode() + b"\n"  # header only
    if pick == 4:
        return b""
    if pick == 5:
        return text.encode("latin-1", "replace")
    return text.encode()


def json_bytes(rng: random.Random) -> bytes:
    names, rows = ladder(rng)
    lines = []
    for row in rows:
        record: dict = {}
        for k, v in zip(names, row, strict=False):
            record[k] = _json_value(rng, v)
        lines.append(json.dumps(record, allow_nan=True))
    pick = rng.randrange(10)
    if pick == 0:
        depth = rng.choice((60, 65, 1_000, 20_000))
        lines.append('{"N": ' + "[" * depth + "]" * depth + ', "tokens": 1, "loss": 1}')
    elif pick == 1:
        lines.append(rng.choice(("[1, 2]", "3", '"x"', "null", "{", "{'N': 1}", '{"N": 1e8,}')))
    elif pick == 2:
        lines.extend(f'{{"k{i}": 1}}' for i in range(rng.choice((10, 1_200))))
    elif pick == 3:
        return codecs.BOM_UTF8 + "\n".join(lines).encode()
    return "\n".join(lines).encode()


def _json_value(rng: random.Random, v: str) -> object:
    try:
        number = float(v)
        if v.strip().lstrip("-").isdigit() and rng.random() < 0.5:
            return int(v)
        return number if rng.random() < 0.8 else v
    except ValueError:
        return rng.choice((v, [v], {"v": v}, None, True)) if rng.random() < 0.3 else v


def parquet_bytes(rng: random.Random, path: Path) -> None:
    import decimal
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    names, rows = ladder(rng)
    columns = {}
    for k, name in enumerate(dict.fromkeys(names)):
        texts = [r[k] if k < len(r) else None for r in rows]
        kind = rng.randrange(8)
        if kind == 0:
            array = pa.array(texts, pa.string())
        elif kind == 1:
            array = pa.array([t.encode("utf-8") + (b"\xff" if rng.random() < 0.1 else b"")
                              if t is not None else None for t in texts], pa.binary())  # fmt: skip
        elif kind == 2:
            array = pa.array([[1.0]] * len(texts))
        elif kind == 3:
            array = pa.array([rng.random() < 0.5 for _ in texts])
        elif kind == 4:
            array = pa.array(texts, pa.string()).dictionary_encode()
        elif kind == 5:
            array = pa.array([decimal.Decimal("1e30")] * len(texts), pa.decimal128(38, 0))
        else:
            array = pa.array([_float(t) for t in texts], pa.float64())
        columns[name] = array
    sink = io.BytesIO()
    pq.write_table(pa.table(columns) if columns else pa.table({"x": []}), sink)
    data = sink.getvalue()
    if rng.random() < 0.15:  # broken: cut short, or a byte flipped
        at = rng.randrange(len(data))
        data = (
            data[:at]
            if rng.random() < 0.5
            else data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1 :]
        )
    path.write_bytes(data)


def _float(text: str | None) -> float | None:
    try:
        return float(text) if text is not None else None
    except ValueError:
        return math.nan


def random_bytes(rng: random.Random) -> bytes:
    return bytes(rng.randrange(256) for _ in range(rng.randrange(0, 400)))


def _checked(result, path: Path, seconds: float) -> str:  # noqa: ANN001
    """'imported' or 'refused'; AssertionError otherwise (module doc)."""
    shown = f"{path.name}: {path.read_bytes()[:300]!r}"
    if answered(result, shown, seconds, PER_CASE_S):
        return "imported"
    lines = result.stderr.splitlines()
    assert lines and lines[0].startswith("error: "), f"{shown}: {result.stderr[:500]!r}"
    assert sum(line.startswith("error:") for line in lines) == 1, result.stderr[:500]
    assert "\x1b" not in result.stderr and "\x07" not in result.stderr, shown
    return "refused"


def _sane(sweep: str) -> None:
    import pyarrow.compute as pc

    from scalelab.analysis.results.import_checks import visible

    table = tables.read_table(tables.TRIALS, sweep)
    assert table.num_rows > 0
    assert pc.min(table["n_params"]).as_py() >= 1 and pc.min(table["tokens"]).as_py() >= 1
    assert all(math.isfinite(c) for c in table["flops"].to_pylist())
    scores = [c for c in table.column_names if c.startswith("eval_")]
    for r in table.to_pylist():
        assert r["final_val_loss"] is not None or any(r[s] is not None for s in scores), r
        for c in ("name", "variant", "size"):
            assert visible(r[c]) == r[c], r


@pytest.mark.timeout(300)
def test_hostile_file_contents_are_imported_or_refused_in_one_line(tmp_path: Path):
    rng = random.Random(SEED)
    home = tmp_path / "home"
    counts: Counter[tuple[str, str]] = Counter()
    start_all = time.monotonic()
    for case in range(CASES):
        kind = rng.choice(("csv", "jsonl", "parquet", "bytes"))
        suffix = rng.choice((".csv", ".jsonl", ".parquet")) if kind == "bytes" else f".{kind}"
        path = tmp_path / f"case{case}{suffix}"
        if kind == "csv":
            path.write_bytes(csv_bytes(rng))
        elif kind == "jsonl":
            path.write_bytes(json_bytes(rng))
        elif kind == "parquet":
            parquet_bytes(rng, path)
        else:
            path.write_bytes(random_bytes(rng))
        sweep = f"fuzz{case}"
        start = time.monotonic()
        with deadline(PER_CASE_S * 3):
            result = scalelab(home, "results", "import", str(path), "--sweep", sweep,
                              *rng.choice(((), ("--duplicates", "keep"))))  # fmt: skip
        outcome = _checked(result, path, time.monotonic() - start)
        if outcome == "imported":
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("SCALELAB_HOME", str(home))
                _sane(sweep)
        counts[kind, outcome] += 1
    print(f"\n{CASES} cases in {time.monotonic() - start_all:.1f} s:", dict(sorted(counts.items())))
    assert sum(counts.values()) == CASES
    assert sum(n for (_, o), n in counts.items() if o == "imported") >= CASES // 10
    assert sum(n for (_, o), n in counts.items() if o == "refused") >= CASES // 2
