"""`results import` on small hostile files: each is refused in one `error:` line (exit 2)
that names the file, and the line where there is one, within seconds and without taking
the machine's memory; text that would drive the terminal is stored and printed escaped.
Before these checks: a 40 KB JSON line nested 20,000 deep killed the command (SIGSEGV in
pyarrow's parser), a 67 KB Parquet file of millions of rows ran out of memory, integers
past int64 gave tracebacks, N = 0.4 became a model of 0 parameters, and escape sequences
in names reached the terminal raw. docs/results.md, "Importing results", lists the limits.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from faults.input_cli import deadline, one_line_error, scalelab

from scalelab.analysis.results import tables


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path / "home"


def _import(home: Path, path: Path, *args: str):  # noqa: ANN202
    with deadline(20):
        return scalelab(home, "results", "import", str(path), "--sweep", "hostile", *args)


def test_json_nested_20000_deep_is_refused_before_any_parser_sees_it(home: Path, tmp_path: Path):
    deep = tmp_path / "deep.jsonl"  # 40 KB
    deep.write_text('{"N": 1e8, "tokens": 2e9, "loss": 3.1}\n'
                    '{"N": ' + "[" * 20_000 + "]" * 20_000 + ', "tokens": 2e9, "loss": 3}\n')  # fmt: skip
    env = {**os.environ, "SCALELAB_HOME": str(home)}
    done = subprocess.run([sys.executable, "-m", "scalelab", "results", "import", str(deep),
                           "--sweep", "hostile"], env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert done.stderr == f"error: {deep}:2: nested 20001 deep, deeper than 64\n"
    # brackets inside a string are text, not depth
    deep.write_text('{"N": 1e8, "tokens": 2e9, "loss": 3.1, "name": "' + "[" * 100 + '"}\n')
    assert _import(home, deep).exit_code == 0
    assert tables.read_table(tables.TRIALS, "hostile")["name"].to_pylist() == ["[" * 100]


def test_more_rows_than_the_limit_are_refused_from_the_count(home: Path, tmp_path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = 2_500_000  # a 50 KB file: one value per column, run-length encoded
    table = pa.table({"N": pa.repeat(pa.scalar(1e8), rows), "D": pa.repeat(pa.scalar(2e9), rows),
                      "loss": pa.repeat(pa.scalar(3.0), rows)})  # fmt: skip
    pq.write_table(table, tmp_path / "big.parquet", compression="zstd")
    said = one_line_error(_import(home, tmp_path / "big.parquet"))
    assert said == f"{tmp_path / 'big.parquet'}: 2,500,000 rows, more than 2,000,000: split the " \
        "file, or raise the limit with --max-rows"  # fmt: skip
    csv = tmp_path / "ladder.csv"
    csv.write_text("N,tokens,loss\n" + "".join(f"{n}e7,2e9,3.{n}\n" for n in range(1, 10)))
    assert "9 rows, more than 8" in one_line_error(_import(home, csv, "--max-rows", "8"))
    assert _import(home, csv, "--max-rows", "9").exit_code == 0


def test_json_lines_with_a_new_key_on_every_line_are_refused(home: Path, tmp_path: Path):
    wide = tmp_path / "wide.jsonl"  # as a table: 5,000 columns of 5,000 rows
    wide.write_text("".join(f'{{"N": 1e8, "tokens": 2e9, "loss": 3, "k{i}": 1}}\n'
                            for i in range(5_000)))  # fmt: skip
    assert one_line_error(_import(home, wide)) == f"{wide}:998: more than 1,000 different keys"


# file contents -> the line's words (each gave a traceback or passed before)
NUMBERS = {
    "an integer past int64 (CSV)": ("N,tokens,loss\n100000000000000000000000,2e9,3.1\n",
                                    "2: N 1e+23: expected a count from 1 to 1e+18"),
    "an integer past int64 (JSON)": ('{"N": 100000000000000000000000, "D": 2e9, "loss": 3}\n',
                                     "1: N '100000000000000000000000': expected a count"),
    "a seed past int64": ("N,tokens,loss,seed\n1e8,2e9,3.1,1e30\n",
                          "2: seed 1e+30: beyond the 64-bit integer range"),
    "C that makes D past int64": ("N,flops,loss\n1,1e300,3.1\n",
                                  "2: C 1e+300 gives D = C / 6N = 1.67e+299 tokens: expected"),
    "C that makes D below one token": ("N,flops,loss\n1e8,1e8,3.1\n",
                                       "2: C 100000000.0 gives D = C / 6N = 0.167 tokens"),
    "N = 0.4": ("N,tokens,loss\n0.4,2e9,3.1\n", "2: N 0.4: expected a count from 1 to 1e+18"),
    "tokens past 1e18": ("N,tokens,loss\n1e8,1e19,3.1\n", "2: D 1e+19: expected a count"),
    "1e400": ('{"N": 1e8, "D": 2e9, "loss": 1e400}\n', "1: loss inf: expected a positive"),
    "-1e400": ("N,tokens,loss\n1e8,-1e400,3.1\n", "2: D -inf: expected a positive finite"),
    "inf in a count": ('{"N": 1e8, "D": 2e9, "loss": 3, "seed": Infinity}\n',
                       "1: seed inf is not an integer"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(NUMBERS))
def test_numbers_out_of_range_are_refused_at_their_line(home: Path, tmp_path: Path, case: str):
    text, says = NUMBERS[case]
    path = tmp_path / ("x.jsonl" if text.startswith("{") else "x.csv")
    path.write_text(text)
    said = one_line_error(_import(home, path))
    assert said.startswith(f"{path}:{says}"), said
    assert tables.read_table(tables.TRIALS, "hostile") is None


def test_escape_sequences_are_stored_and_printed_escaped(home: Path, tmp_path: Path):
    path = tmp_path / "names\x1b[2J.csv"
    path.write_text('N,tokens,loss,name,variant,size,"\x1b]0;title\x07"\n'
                    '1e8,2e9,3.1,"\x1b[2J",\x1b]0;title\x07,"a\u202eb",1\n')  # fmt: skip
    result = _import(home, path)
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.stdout and "\x07" not in result.stdout
    assert "names\\x1b[2J.csv" in result.stdout and "\\x1b]0;title\\x07" in result.stdout
    [row] = tables.read_table(tables.TRIALS, "hostile").to_pylist()
    assert (row["name"], row["variant"], row["size"]) == (
        "\\x1b[2J", "\\x1b]0;title\\x07", "a\\u202eb"
    )  # fmt: skip
    path.write_text("N,tokens,loss\n1e8,x\x1b[31m,3\n")  # the path and the value, in an error
    result = _import(home, path)
    assert result.exit_code == 2 and "\x1b" not in result.stderr, result.stderr
    assert "names\\x1b[2J.csv:2: D" in result.stderr


def test_parquet_text_that_is_not_utf8_is_refused_at_its_row(home: Path, tmp_path: Path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    variant = pa.array([b"dense", b"den\xc8se"], pa.binary()).view(pa.string())  # unchecked
    path = tmp_path / "odd.parquet"
    pq.write_table(pa.table({"N": [1e8, 2e8], "D": [2e9, 2e9], "loss": [3.1, 3.0],
                             "variant": variant}), path)  # fmt: skip
    said = one_line_error(_import(home, path))
    assert said == f"{path}:row 2: variant b'den\\xc8se' is not UTF-8 text"
