"""Seeded fuzz of the command line's own arguments through the real CLI (issue 33, item 6):
`KEY=VALUE` overrides, `results query --where` and `--metric`, and the names that commands
take (trials, sweeps). Bad arguments are refused with an `error:` line, never a traceback.

Each case runs in this process (click's CliRunner on the typer app's command), except those
carrying bytes that are not UTF-8: a real command line decodes them to surrogate escapes,
which `scalelab.cli.main.main` refuses before any command runs, so those go through main().
For every case:
- no traceback, and an answer within PER_CASE_S seconds;
- exit 0 (accepted), or exit 2 with stderr starting `error: ` (click's `Usage:` for an
  argument that reads as an option);
- an override that is refused by `submit --dry-run` is refused by the real `submit` too
  (every SUBMIT_EVERY-th such case), and no MLflow run is ever created.
The counts are printed and recorded in docs/reliability.md.
"""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from click.testing import Result
from faults.input_cli import answered, deadline, runs_in, scalelab

SEED = 3317
PER_CASE_S = 10.0
SUBMIT_EVERY = 5
SWEEP = """name: fuzz
base:
  model: {size: nano, vocab_size: 256, block_size: 64}
  data: {source: "builtin:pydoc", tokenizer: byte, seq_len: 64}
  train: {tokens: 4096, global_batch_tokens: 512}
grid:
  seed: [0, 1]
backend: {concurrency: 1, cpus_per_trial: 0.5, max_retries: 0}
"""
KEYS = ("train.lr", "train.tokens", "train.global_batch_tokens", "backend.concurrency",
        "description", "name", "grid.seed", "grid.train.lr", "model.size", "variants",
        "data.source", "seed", "base.model.vocab_size", "zip.train.lr", "backend.kind",
        "train.dtype", "model.hadamard", "model.budget.k", "deepspeed.zero_stage")  # fmt: skip
COLUMNS = ("trial_id", "variant", "size", "status", "tokens", "flops", "final_val_loss")
METRICS = ("val/loss", "train/loss", "train/lr", "compute/flops")


def nasty(rng: random.Random) -> str:
    """A string a hostile or careless user might type."""
    pick = rng.randrange(14)
    if pick == 0:
        return rng.choice("ab.λ名🦜/-_") * rng.choice((1, 64, 255, 256, 4_000, 100_000))
    if pick == 1:
        return rng.choice(("9", "1", "0")) * rng.choice((19, 20, 400, 4_301, 9_000))
    if pick == 2:
        return "-" * rng.randrange(1, 2_500) + "1"
    if pick == 3:
        return "[" * rng.randrange(1, 300) + "1" + "]" * rng.randrange(0, 300)
    if pick == 4:
        return "{a: " * rng.randrange(1, 200) + "1" + "}" * rng.randrange(0, 200)
    if pick == 5:
        return "".join(chr(rng.randrange(1, 0x3000)) for _ in range(rng.randrange(1, 60)))
    return rng.choice((
        "", " ", "\t", "\n", "\x1b[31mred", "[bold]x[/bold]", "%s%n%x", "../../../etc/passwd",
        "/", ".", "..", "~", "$(id)", "`id`", "; id", "*", "?", "[a-z]", "'\"", "\\",
        "-1", "1e999", "1.0e+400", "nan", "inf", "-inf", "None", "null", "~", "true",
        "!!python/object/apply:os.system ['id']", "&a [*a, *a]", "!!binary AAAA", "0x10",
        "1_000", "3.0e-4", "[1, [2, [3]]]", "{a: 1, a: 2}", "\u202egnp.exe", "\ufeff",
    ))  # fmt: skip


def override(rng: random.Random) -> str:
    key = rng.choice(KEYS)
    shape = rng.randrange(8)
    if shape == 0:
        key = ".".join(
            rng.choice(("a", "train", "λ", "x" * 300)) for _ in range(rng.randrange(2, 1_500))
        )
    elif shape == 1:
        key = rng.choice(("", ".", "..", "train.", ".lr", "train..lr", " = ", "=")) + key
    elif shape == 2:
        key = nasty(rng)
    value = nasty(rng) if rng.random() < 0.8 else rng.choice(("1", "0.001", "[1, 2]", "x"))
    return rng.choice((f"{key}={value}", key, f"{key}=={value}", f"={value}"))


def where(rng: random.Random, depth: int = 0) -> str:
    pick = rng.randrange(12)
    if pick == 0 or depth > 6:
        return nasty(rng)
    if pick == 1:
        return "not " * rng.randrange(1, 400) + f"{rng.choice(COLUMNS)} == 'x'"
    if pick == 2:
        return f"tokens > {'-' * rng.randrange(1, 3_000)}1"
    if pick == 3:
        return f"tokens > {rng.choice(('9' * 5_000, '9' * 30, '-' + '9' * 25, '1e400', '1j'))}"
    if pick == 4:
        return rng.choice((
            "__import__('os').system('id')", "lambda: 1", "[x for x in ()]", "a if b else c",
            "f'{tokens}'", "tokens.__class__", "open('/etc/passwd')", "(x := 1)", "*tokens",
            "tokens @ 2", "b'x' == size", "size in 'abc'", "size in [1, [2]]", "tokens()",
            "size == size", "1 < 2", "True", "None", "...", "yield 1", "await x",
        ))  # fmt: skip
    if pick == 5:
        return "(" * rng.randrange(1, 500) + "tokens > 1" + ")" * rng.randrange(0, 500)
    column = rng.choice((*COLUMNS, "nope", "λ", "_", "a" * 300))
    op = rng.choice(("==", "!=", "<", "<=", ">", ">=", "in", "not in", "is", "=", "<>"))
    literal = rng.choice(("1", "'nano'", "True", "None", "1.5", "-2", "[1, 2]", nasty(rng)))
    joined = rng.choice((" and ", " or ", ""))
    tail = f"{joined}{where(rng, depth + 1)}" if joined else ""
    return f"{column} {op} {literal}{tail}"


def metric_args(rng: random.Random) -> list[str]:
    metric = rng.choice(METRICS) if rng.random() < 0.3 else nasty(rng)
    args = ["--metric", metric]
    if rng.random() < 0.5:
        args += ["--at", rng.choice(("1", "-1", "0", "1e999", "nan", "x", "9" * 40, nasty(rng)))]
    return args


def name_args(rng: random.Random) -> list[str]:
    name = nasty(rng)
    return rng.choice((
        ["generate", name, "--prompt", "x"], ["results", "query", name], ["logs", "fuzz", name],
        ["generate", name, "--prompt", nasty(rng), "--max-new-tokens", "1"],
    ))  # fmt: skip


def surrogate(rng: random.Random) -> str:
    """A command-line argument holding a byte that is not UTF-8, as Python decodes it."""
    return nasty(rng)[:50] + rng.choice(("\udcff", "\udc80", "\udcc3\udca9")) + "x"


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """A work directory with the sweep file and results tables of sweep 'fuzz' (written as
    `results sync` would: queries reach the --where and --metric parsers, not MLflow)."""
    import pyarrow as pa

    from scalelab.analysis.results.tables import write_table

    home = tmp_path_factory.mktemp("fuzz-home")
    (home / "sweep.yaml").write_text(SWEEP)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SCALELAB_HOME", str(home))  # write_table's default root is the home's
        trials = pa.table({
            "trial_id": ["a1", "b2"], "variant": ["dense", "hadamard"], "size": ["nano"] * 2,
            "status": ["FINISHED"] * 2, "tokens": [4096, 4096], "flops": [1e9, 9e8],
            "final_val_loss": [3.2, 3.1],
        })  # fmt: skip
        curves = pa.table({
            "trial_id": ["a1", "a1", "b2"], "step": [1, 2, 2], "tokens": [512, 1024, 1024],
            "flops": [1e8, 2e8, 2e8], "metric": ["val/loss"] * 3, "value": [4.0, 3.2, 3.1],
        })  # fmt: skip
        write_table("trials", "fuzz", trials)
        write_table("curves", "fuzz", curves)
    return home


def _checked(result: Result, args: list[str], seconds: float) -> str:
    """'accepted' or 'refused'; AssertionError on a traceback, a slow answer or a refusal
    that is not an `error:` line."""
    shown = repr(args)[:300]
    if answered(result, shown, seconds, PER_CASE_S):
        return "accepted"
    # ours: one `error:` line (several for an invalid sweep); click's, for an argument that
    # reads as an unknown option ("-1=x"): its usage and error box
    assert result.stderr.startswith(("error: ", "Usage: ")), f"{shown}: {result.stderr[:500]!r}"
    return "refused"


def _through_main(args: list[str], capsys: pytest.CaptureFixture) -> str:
    from scalelab.cli.main import main

    argv = sys.argv
    sys.argv = ["scalelab", *args]
    try:
        with pytest.raises(SystemExit) as ended:
            main()
    finally:
        sys.argv = argv
    err = capsys.readouterr().err
    assert ended.value.code == 2 and err.startswith("error: argument ") and "not UTF-8" in err
    assert len(err.splitlines()) == 1, err
    return "refused"


# The inputs issue 33 (item 6) found tracebacks for, each refused in one `error:` line now.
REPORTED = {
    "--where with a huge integer (OverflowError)": (
        ["results", "query", "fuzz", "--where", "tokens > " + "9" * 30], "64-bit integer range"),
    "--where with 1,001 nested unary minus (RecursionError)": (
        ["results", "query", "fuzz", "--where", "tokens > " + "-" * 1_001 + "'a'"],
        "expected a literal"),
    "a 1,000-level override key (the file's 64-level limit)": (
        ["submit", "{sweep}", "--dry-run", ".".join(["a"] * 1_000) + "=1"], "deeper than 64"),
    "generate with a 100,000-character name (OSError)": (
        ["generate", "a" * 100_000, "--prompt", "x"], "not a trial id"),
    "a long non-ASCII sweep name (OSError)": (
        ["results", "query", "名" * 90], "is not a sweep name"),
}  # fmt: skip
NOT_UTF8 = {  # through main(), as a real command line delivers them
    "a non-UTF-8 byte in --where": ["results", "query", "fuzz", "--where", "size == '\udcff'"],
    "a non-UTF-8 override value": ["submit", "sweep.yaml", "description=\udcff"],
    "--metric with a non-UTF-8 byte": ["results", "query", "fuzz", "--metric", "val\udcff"],
}


@pytest.mark.parametrize("case", sorted(REPORTED))
def test_the_reported_inputs_are_refused_in_one_line(home: Path, case: str):
    args, says = REPORTED[case]
    args = [a.replace("{sweep}", str(home / "sweep.yaml")) for a in args]
    result = scalelab(home, *args)
    assert _checked(result, args, 0.0) == "refused"
    assert len(result.stderr.splitlines()) == 1 and says in result.stderr


@pytest.mark.parametrize("case", sorted(NOT_UTF8))
def test_bytes_that_are_not_utf8_are_refused_before_any_command(case: str, capsys):
    assert _through_main(NOT_UTF8[case], capsys) == "refused"


@pytest.mark.slow
def test_command_line_arguments_are_refused_cleanly(home: Path, capsys):
    rng = random.Random(SEED)
    counts: Counter[tuple[str, str]] = Counter()
    sweep = str(home / "sweep.yaml")
    cases = (
        [("override", ["submit", sweep, "--dry-run", "--json",
                       *(override(rng) for _ in range(rng.randrange(1, 4)))])
         for _ in range(170)]
        + [("where", ["results", "query", "fuzz", "--where", where(rng)]) for _ in range(150)]
        + [("metric", ["results", "query", "fuzz", *metric_args(rng)]) for _ in range(80)]
        + [("name", name_args(rng)) for _ in range(80)]
    )  # fmt: skip
    for kind, args in [("override", ["submit", sweep, f"description={surrogate(rng)}"]),
                       ("where", ["results", "query", "fuzz", "--where", surrogate(rng)]),
                       ("metric", ["results", "query", "fuzz", "--metric", surrogate(rng)]),
                       ("name", ["generate", surrogate(rng), "--prompt", "x"])] * 5:  # fmt: skip
        counts[kind, _through_main(args, capsys) + " (not UTF-8)"] += 1
    refused_overrides = 0
    for kind, args in cases:
        start = time.monotonic()
        with deadline(PER_CASE_S * 3):
            result = scalelab(home, *args)
        outcome = _checked(result, args, time.monotonic() - start)
        counts[kind, outcome] += 1
        if kind == "override" and outcome == "refused":
            refused_overrides += 1
            if refused_overrides % SUBMIT_EVERY == 0:  # the real submit refuses it too
                real = [a for a in args if a not in ("--dry-run", "--json")]
                start = time.monotonic()
                with deadline(PER_CASE_S * 3):
                    submitted = scalelab(home, *real)
                assert _checked(submitted, real, time.monotonic() - start) == "refused"
                counts[kind, "refused by submit too"] += 1
    print("\ncases:", sum(n for (k, o), n in counts.items() if "too" not in o), dict(counts))
    assert sum(n for (k, o), n in counts.items() if "too" not in o) >= 500
    assert counts["where", "refused"] > 100 and counts["override", "refused"] > 100
    assert runs_in(home) == 0
