"""Hostile sweep files and CLI arguments end in one line and exit code 2, in bounded time,
with nothing created (issue 17, defect 6: a ~500-character experiment name gave a
traceback and a run with a NULL experiment id; non-UTF-8, UTF-16 and binary files gave
raw tracebacks; malformed YAMLs hung; a 30,000-deep `not` in --where ran out of memory)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from faults.input_cli import deadline, one_line_error, problem_lines, runs_in, scalelab

SWEEP = """name: files
base:
  model: {size: nano, vocab_size: 256, block_size: 64}
  data: {source: "builtin:pydoc", tokenizer: byte, seq_len: 64}
  train: {tokens: 4096, global_batch_tokens: 512}
"""


def test_an_experiment_name_mlflow_cannot_store_is_refused_at_its_line(tmp_path):
    path, home = tmp_path / "sweep.yaml", tmp_path / "home"
    path.write_text(SWEEP + "experiment: " + "e" * 600 + "\n")
    for args in (("--dry-run",), ()):
        line = one_line_error(scalelab(home, "submit", path, *args))
        assert line.startswith(f"{path}:6: experiment: String should have at most 256 characters")
    assert runs_in(home) == 0 and not (home / "mlflow.db").exists()


ACCENTED = SWEEP.replace("name: files", "name: files  # café “naïve”")
UNDECODABLE = [
    ("latin-1", ACCENTED.encode("latin-1", "replace"), ":1: not UTF-8 text (byte 0xe9"),
    ("utf-16", ACCENTED.encode("utf-16"), ": UTF-16 or UTF-32 text"),
    ("utf-16-le", ACCENTED.encode("utf-16-le"), ":1: a NUL byte"),
    ("utf-32", ACCENTED.encode("utf-32"), ": UTF-16 or UTF-32 text"),
    ("png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", ":3: a NUL byte"),
    ("gzip", b"\x1f\x8b\x08\x08\xa5\x1b\x8fe\x02\x03\xff", ":1: not UTF-8 text (byte 0x8b"),
    ("control", b"name: a\x07b\n", ": malformed YAML: control characters are not allowed"),
    ("too-big", b"name: x\ndescription: " + b"y" * 1_100_000, ": larger than 1,000,000 bytes"),
]


@pytest.mark.parametrize(
    "data, expected", [c[1:] for c in UNDECODABLE], ids=[c[0] for c in UNDECODABLE]
)
def test_a_file_that_is_not_utf8_yaml_text_is_named_in_one_line(tmp_path, data, expected):
    path = tmp_path / "sweep.yaml"
    path.write_bytes(data)
    line = one_line_error(scalelab(tmp_path / "home", "submit", path, "--dry-run"))
    assert line.startswith(f"{path}{expected}"), line


def test_a_utf8_byte_order_mark_is_fine(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + SWEEP.encode())
    assert scalelab(tmp_path / "home", "submit", path, "--dry-run").exit_code == 0


# YAML shapes that made the loader hang (PyYAML's pure-Python scanner is quadratic in
# open flow collections) or recurse out of the stack; each must be refused at once.
N = 100_000
HOSTILE = [
    ("deep-flow-sequence", "name: x\nbase: " + "[" * N + "]" * N, ":2: malformed YAML"),
    ("unclosed-flow-mappings", "name: x\nbase: " + "{a: " * N, ":2: nested deeper than 64"),
    ("flow-in-a-key", "name: x\n" + "[" * N + ": 1", ":2: malformed YAML"),
    ("deep-block-sequence", "name: x\nbase:\n" + "- " * N, ":3: nested deeper than 64 levels"),
    ("nested-block-maps", "".join("  " * i + "k:\n" for i in range(200)), ":65: nested deeper"),
    ("many-nodes", "name: x\nbase: [" + "1, " * 300_000 + "]", "more than 100,000 nodes"),
    ("alias-bomb", "\n".join(
        ['a: &a ["x","x","x","x","x","x","x","x","x"]']
        + [f"{c}: &{c} [" + ",".join([f"*{p}"] * 9) + "]" for p, c in zip("abcdefgh", "bcdefghi", strict=True)]
    ), "more than 100,000 nodes"),
    ("self-alias", "name: x\nbase: &a [*a]", ":2: nested deeper than 64"),
    ("huge-int", "name: x\nseed: " + "9" * 5000, ":2: malformed YAML: cannot read"),
    ("timestamp-tag", "name: x\ndescription: !!timestamp 2020-13-45", ":2: malformed YAML"),
    ("python-tag", "name: !!python/object/apply:os.system ['true']", ":1: malformed YAML"),
]  # fmt: skip


@pytest.mark.parametrize("text, expected", [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_a_hostile_yaml_is_refused_in_bounded_time(tmp_path, text, expected):
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    with deadline(10):
        result = scalelab(tmp_path / "home", "submit", path, "--dry-run")
    line = one_line_error(result)
    assert line.startswith(str(path)) and expected in line, line


@pytest.mark.parametrize("kind", ["fifo", "folder", "device"])
def test_a_sweep_path_that_is_not_a_regular_file_is_refused_at_once(tmp_path, kind):
    """Issue 33, item 7: a named pipe as the sweep file blocked `submit` forever."""
    import os

    path = {"fifo": tmp_path / "sweep.yaml", "folder": tmp_path, "device": "/dev/zero"}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    for command in (["submit", path, "--dry-run"], ["submit", path]):
        with deadline(10):
            result = scalelab(tmp_path / "home", *command)
        line = one_line_error(result)
        assert line.startswith(str(path)) and ("not a regular file" in line or "a folder" in line)
    assert runs_in(tmp_path / "home") == 0


def test_a_date_is_read_as_text(tmp_path):
    path = tmp_path / "sweep.yaml"
    path.write_text(SWEEP + "description: 2020-13-45\n")
    assert scalelab(tmp_path / "home", "submit", path, "--dry-run").exit_code == 0


@pytest.fixture
def synced(tmp_path):
    """A sweep 'w' with a results table, so that `results query w` reaches --where."""
    from scalelab.analysis.results import tables

    home = tmp_path / "home"
    table = pa.table({"trial_id": ["a", "b"], "variant": ["dense", "tsa"], "n_params": [1, 2]})
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SCALELAB_HOME", str(home))
        tables.write_table(tables.TRIALS, "w", table)
    return home


@pytest.mark.parametrize(
    "where, expected",
    [
        ("not " * 30_000 + "variant == 'x'", "--where: longer than 10,000 characters"),
        ("not " * 500 + "variant == 'x'", "--where: nested deeper than 100 levels"),
        ("(" * 300 + "variant == 'x'" + ")" * 300, "--where"),
        ("(variant == 'x' and " * 150 + "True" + ")" * 150, "--where: nested deeper than 100"),
    ],
    ids=["30000-not", "500-not", "300-parens", "150-nested-and"],
)
def test_a_deeply_nested_where_is_one_line(synced, where, expected):
    result = scalelab(synced, "results", "query", "w", "--where", where)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert result.stderr.startswith(f"error: {expected}"), result.stderr[:300]
    ok = scalelab(synced, "results", "query", "w", "--where", "not not variant == 'tsa'")
    assert ok.exit_code == 0 and "tsa" in ok.stdout


def test_other_commands_name_the_bad_file_too(tmp_path):
    home = tmp_path / "home"
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"name: x\nbase: {model: [1, 2}\n")
    assert one_line_error(scalelab(home, "status", bad)).startswith(f"{bad}:2: malformed YAML")
    job = tmp_path / "job.yaml"
    job.write_bytes(b"model: {size: nano}\ntrain: {tokens: [\n")
    assert one_line_error(scalelab(home, "train", job)).startswith(f"{job}:3: malformed YAML")
    job.write_bytes("model: {size: nano}  # é\n".encode("latin-1"))
    assert one_line_error(scalelab(home, "train", job)).startswith(f"{job}:1: not UTF-8 text")
    job.write_text("model: {size: nano, vocab_size: 256, block_size: 64}\ntrain: {lr: -1}\n")
    assert "train.lr" in one_line_error(scalelab(home, "train", job))
    assert not (home / "trials").exists() and runs_in(home) == 0


def test_markup_in_an_error_is_printed_as_text(tmp_path):
    """Rich markup in a key ('[/x]') must not be parsed (it raised MarkupError)."""
    path = tmp_path / "sweep.yaml"
    path.write_text(SWEEP + "'[/x] [bold]': 1\n")
    line = one_line_error(scalelab(tmp_path / "home", "submit", path, "--dry-run"))
    assert line.startswith(f"{path}:6: [/x] [bold]: unknown key")


def test_an_output_file_that_cannot_be_written_is_one_line(synced, tmp_path):
    for target in (tmp_path / "no-such-folder" / "out.csv", tmp_path):
        result = scalelab(synced, "results", "query", "w", "-f", "csv", "-o", target)
        assert result.exit_code == 2 and "Traceback" not in result.output
        assert result.stderr.startswith(f"error: --output {target}: cannot write ("), result.stderr


@pytest.mark.parametrize("section", ["model", "data", "train"])
def test_a_section_that_is_not_a_mapping_is_reported_even_when_an_axis_sets_a_key_in_it(
    tmp_path, section
):
    """Found by the fuzz at 3,000 cases: `model: 'a string'` with variants raised
    AttributeError; with an axis inside it, the string was silently replaced."""
    key = {"model": "model.size", "data": "data.seq_len", "train": "train.lr"}[section]
    value = {"model": "nano", "data": 64, "train": 0.001}[section]
    lines = SWEEP.splitlines()
    row = next(i for i, r in enumerate(lines) if r.startswith(f"  {section}:"))
    lines[row] = f"  {section}: a string"
    path = tmp_path / "sweep.yaml"
    path.write_text("\n".join(lines) + f"\nvariants: [dense, tsa]\ngrid: {{{key}: [{value}]}}\n")
    for line in problem_lines(scalelab(tmp_path / "home", "submit", path, "--dry-run")):
        assert line.startswith(f"{path}:{row + 1}: base.{section}: Input should be a valid")
