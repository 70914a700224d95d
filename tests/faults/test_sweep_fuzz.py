"""Seeded fuzz of sweep files through the real CLI: bad input stops before anything runs.

Each case mutates one of the shipped CPU sweeps (tests/faults/sweep_mutations.py: keys,
values, sizes, encodings, bytes, YAML structure), writes it to a file and runs
`scalelab submit FILE --dry-run --json` in this process (click's CliRunner on the typer
app's command: no new interpreter per case). For every case:
- no traceback, and an answer within PER_CASE_S seconds;
- either the tool accepts it (a *valid* mutant: exit 0 and a JSON plan of >= 1 trial; it
  is never submitted), or it refuses it (exit 2) with one line per problem, each naming
  the file, and the line and key where there is one (file-level problems: the file and
  what is wrong with it); a mutant built to be invalid must be refused;
- a refused mutant is also given to the real `submit` (no --dry-run), which must refuse
  it the same way before submission (reaching the driver fails the case);
- the tracking store holds zero runs (the sqlite file is never even created).
The counts (tried, refused cleanly, valid) are printed and recorded in docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
from collections import Counter
from pathlib import Path

from click.testing import Result
from faults.input_cli import blocker_lines, problem_lines, runs_in, scalelab
from faults.sweep_mutations import Mutant, mutate

from scalelab.cli import sweeps as commands

SEED = 1717
CASES = int(os.environ.get("SCALELAB_FUZZ_CASES", "500"))
PER_CASE_S = 5.0
SWEEPS = Path(__file__).resolve().parents[2] / "sweeps"
BASES = ("demo", "hadamard_cpu", "tsa_cpu", "tsa_synthetic", "budgetformer_cpu")
# problems about the file as a whole, or a line without a single key
FILE_LEVEL = (
    "malformed YAML", "nested deeper", "the document expands", "duplicate key",
    "a sweep is a mapping", "trial combinations", "the sweep has no trials",
    "the file is empty", "not UTF-8", "UTF-16", "NUL byte", "larger than",
)  # fmt: skip


def problems_of(result: Result, path: str) -> list[str]:
    """The problem lines of a refusal, each naming the file, and the line and key where the
    problem has them; AssertionError when the refusal is not well-formed."""
    found = problem_lines(result)
    keyed = re.compile(rf"{re.escape(path)}:\d+: .+?: \S")  # file:line: key: message
    for line in found:
        assert line.startswith(path), line
        assert keyed.match(line) or any(p in line for p in FILE_LEVEL), line
    return found


def _blockers(result: Result) -> list[str]:
    """The blockers of a dry-run's JSON plan; [] when it printed no plan."""
    try:
        return json.loads(result.stdout)["blockers"]
    except (ValueError, KeyError, TypeError):
        return []


def assert_no_traceback(result: Result) -> None:
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert "Traceback" not in result.output, result.output[-2000:]


def check_case(i: int, mutant: Mutant, folder: Path, home: Path) -> str:
    """'valid' or 'refused'; AssertionError with the reason otherwise."""
    path = folder / f"case-{i:03d}.yaml"
    path.write_bytes(mutant.data)
    t0 = time.perf_counter()
    dry = scalelab(home, "submit", path, "--dry-run", "--json")
    elapsed = time.perf_counter() - t0
    assert_no_traceback(dry)
    assert elapsed < PER_CASE_S, f"took {elapsed:.1f} s"
    if dry.exit_code == 0:
        assert not mutant.must_fail, "a mutant built to be invalid was accepted"
        assert json.loads(dry.stdout)["trials"], dry.stdout[:500]
        outcome = "valid"
    elif blockers := _blockers(dry):  # a valid sweep whose data is not here: planned, exit 2
        assert json.loads(dry.stdout)["trials"], dry.stdout[:500]
        keyed = re.compile(rf"{re.escape(str(path))}:\d+: .+?: \S")
        assert all(keyed.match(line) for line in blockers), blockers
        assert blocker_lines(scalelab(home, "submit", path)) == blockers
        outcome = "refused"
    else:
        problems = problems_of(dry, str(path))
        real = scalelab(home, "submit", path)  # the submission path stops the same way
        assert problems_of(real, str(path)) == problems
        outcome = "refused"
    assert runs_in(home) == 0, "runs were created"
    return outcome


def test_fuzzed_sweeps_stop_cleanly_before_anything_runs(tmp_path, monkeypatch):
    def reached_submission(*args: object, **kwargs: object) -> None:
        raise AssertionError("an invalid sweep reached the driver")

    monkeypatch.setattr(commands, "_drive", reached_submission)
    home, folder = tmp_path / "home", tmp_path / "cases"
    folder.mkdir()
    texts = {name: (SWEEPS / f"{name}.yaml").read_text() for name in BASES}
    for name, text in texts.items():  # every base is valid as shipped
        path = folder / f"{name}.yaml"
        path.write_text(text)
        result = scalelab(home, "submit", path, "--dry-run", "--json")
        assert result.exit_code == 0, result.output
    rng = random.Random(SEED)
    counts: Counter[str] = Counter()
    valid_by_family: Counter[str] = Counter()
    failures = []
    t0 = time.perf_counter()
    for i in range(CASES):
        base = rng.choice(BASES)
        mutant = mutate(rng, texts[base])
        try:
            outcome = check_case(i, mutant, folder, home)
            counts[outcome] += 1
            if outcome == "valid":
                valid_by_family[mutant.family] += 1
        except AssertionError as e:
            failures.append(f"case {i} ({base}, {mutant.family}: {mutant.what}): {e}")
    wall = time.perf_counter() - t0
    print(
        f"\nsweep fuzz: {CASES} cases tried, {counts['refused']} refused cleanly, "
        f"{counts['valid']} valid (accepted, not submitted), {len(failures)} failed; "
        f"{wall:.1f} s; valid mutants by family: {dict(valid_by_family)}"
    )
    assert not failures, f"{len(failures)} of {CASES} cases failed:\n" + "\n".join(failures[:15])
    assert counts["refused"] + counts["valid"] == CASES
    assert counts["refused"] >= CASES // 2  # most mutations break a sweep
