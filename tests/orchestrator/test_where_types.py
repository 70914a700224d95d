"""`--where` compares each literal in its column's own type: int64 beyond 2^24 and 2^53
exactly (`tokens >= 1e9` on a real ladder), floats against integers that a double cannot
hold, True/False and 0/1 on bool columns, strings; every operator the syntax has, each
asserting the exact rows kept. Then the same on the imported Chinchilla ladder through
`results query` and `results fit`."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from typer.testing import CliRunner

from scalelab.analysis.results import ResultsError
from scalelab.analysis.results.query import filter_table

BIG = 2**53 + 1  # the first integer a double cannot hold

# ids a..e; e holds the missing values (d's string and bool too)
TABLE = pa.table({
    "id": ["a", "b", "c", "d", "e"],
    "n": pa.array([5, 2**24 + 1, 20_000_000_001, BIG, None], pa.int64()),
    "x": pa.array([0.5, 1.5, 1e18, 2.0**53, None], pa.float64()),
    "ok": pa.array([True, False, True, None, False], pa.bool_()),
    "s": pa.array(["nano", "micro", "mini", None, "nano"], pa.string()),
})  # fmt: skip

CASES = {
    # int64 above 2^24 (and 2^53): exact, whatever the literal's type
    "n == 20000000001": "c",
    "n == 20000000001.0": "c",
    f"n == {BIG}": "d",
    "n == 9007199254740992.0": "",  # 2^53 as a float is not 2^53 + 1
    "n > 9007199254740992.0": "d",
    "n != 16777217": "acd",
    "n < 16777217": "a",
    "n <= 16777217": "ab",
    "n > 16777217": "cd",
    "n >= 1e9": "cd",
    "n >= 16777216.5": "bcd",
    "n < 16777217.5": "ab",
    "n == 1.5": "",
    "n != 1.5": "abcd",
    "n < 1e300": "abcd",
    "n > 1e300": "",
    "n >= -1e999": "abcd",  # -inf
    "n in [5, 20000000001]": "ac",
    "n in [5.0, 2e10, 1.5]": "a",  # 2e10 is not 20000000001
    "n not in [5, 16777217]": "cde",  # a missing value is in no list
    "n is None": "e",
    "n is not None": "abcd",
    f"1e9 <= n < {BIG}": "c",  # chained, the literal on the left
    "20000000001 == n": "c",
    "not (n >= 1e9)": "ab",
    "n >= 1e9 and s == 'mini'": "c",
    "n < 1e9 or s is None": "abd",
    # floats, against integers a double cannot hold
    "x == 1.5": "b",
    "x != 1.5": "acd",
    "x < 1": "a",
    "x <= 1.5": "ab",
    "x > 1.5": "cd",
    "x >= 1e18": "c",
    "x >= 1": "bcd",
    "x == 1000000000000000000": "c",
    f"x == {BIG}": "",
    f"x != {BIG}": "abcd",
    f"x < {BIG}": "abd",
    f"x >= {BIG}": "c",
    "x > 9007199254740991": "cd",
    "x in [0.5, 1e18]": "ac",
    f"x in [1, 1000000000000000000, {BIG}]": "c",
    "x not in [0.5]": "bcde",
    "x is None": "e",
    # bools: True/False, and 0/1 in the bool's own type
    "ok": "ac",
    "not ok": "be",
    "ok == True": "ac",
    "ok != True": "be",
    "ok == False": "be",
    "ok == 1": "ac",
    "ok == 0": "be",
    "ok > 0": "ac",
    "ok < True": "be",
    "ok == 2": "",
    "ok in [True]": "ac",
    "ok not in [False]": "acd",
    "ok is None": "d",
    "ok and n >= 1e9": "c",
    # strings
    "s == 'nano'": "ae",
    "s != 'nano'": "bc",
    "s < 'mini'": "b",
    "s <= 'mini'": "bc",
    "s > 'mini'": "ae",
    "s >= 'mini'": "ace",
    "s in ['nano', 'mini']": "ace",
    "s not in ['nano']": "bcd",
    "s is None": "d",
    "'nano' == s": "ae",
}


def _ids(table: pa.Table) -> str:
    return "".join(table["id"].to_pylist())


@pytest.mark.parametrize("where", sorted(CASES))
def test_every_operator_keeps_the_exact_rows(where: str):
    assert _ids(filter_table(TABLE, where)) == CASES[where]


@pytest.mark.parametrize(
    "where", ["s == 'nano'", "s != 'nano'", "s in ['nano', 'mini']", "s not in ['nano']"]
)
def test_dictionary_strings_compare_as_strings(where: str):
    """The curves table's joined trial columns are dictionary-encoded."""
    table = TABLE.set_column(4, "s", TABLE["s"].dictionary_encode())
    assert _ids(filter_table(table, where)) == CASES[where]


@pytest.mark.parametrize(
    "where, says",
    [
        ("s == 1", "s holds text"),
        ("s in ['nano', 1]", "s holds text"),
        ("n == 'nano'", "n holds numbers"),
        ("x >= '1e9'", "x holds numbers"),
        ("ok == 'yes'", "ok holds True/False"),
    ],
)
def test_a_literal_of_another_kind_is_one_clear_error(where: str, says: str):
    with pytest.raises(ResultsError, match=says):
        filter_table(TABLE, where)


def _run(*args: str) -> str:
    from scalelab.cli.main import app

    res = CliRunner().invoke(app, ["results", *args])
    assert res.exit_code == 0, (args, res.output)
    return res.stdout


def test_the_ladder_is_queried_and_fitted_on_tokens_above_1e9(chinchilla: pa.Table):
    tokens = chinchilla["tokens"].to_pylist()
    assert chinchilla.schema.field("tokens").type == pa.int64() and max(tokens) > 2**24
    kept = sorted(t for t in tokens if t >= 10**9)
    assert 0 < len(kept) < len(tokens)
    rows = json.loads(_run("query", "chin", "--where", "tokens >= 1e9", "--format", "json"))
    assert sorted(r["tokens"] for r in rows) == kept
    exact = tokens[0]
    rows = json.loads(_run("query", "chin", "--where", f"tokens == {exact}", "--format", "json"))
    assert [r["tokens"] for r in rows] == [t for t in tokens if t == exact]
    fit = json.loads(_run("fit", "chin", "--where", "tokens >= 1e9", "--json", "--resamples", "5"))
    assert fit["n_used"] == len(kept) and fit["where"] == "tokens >= 1e9"


def test_compare_and_the_fit_api_read_where_in_the_columns_types(tmp_path, monkeypatch):
    """`results compare --where` and `fit_sweep(where=...)` filter as `results query` does:
    `tokens >= 1e9` on an int64 column above 2^24 (was: ArrowInvalid, 'not in range')."""
    from scalelab.analysis.results.fit import fit_sweep
    from scalelab.analysis.results.imports import import_file

    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    rows = ["variant,seed,n_params,tokens,loss"]
    for n, d in ((2e7, 6e8), (5e7, 2e9), (1e8, 3e9), (2e8, 5e9)):
        for seed in (0, 1, 2):
            for variant, shift in (("dense", 0.0), ("hadamard", -0.01 * (seed + 1))):
                loss = 1.7 + 400 / n**0.34 + 400 / d**0.28 + shift
                rows.append(f"{variant},{seed},{int(n)},{int(d)},{loss:.6f}")
    (tmp_path / "ladder.csv").write_text("\n".join(rows) + "\n")
    import_file(tmp_path / "ladder.csv", "pairs")
    res = json.loads(
        _run("compare", "pairs", "-m", "final_val_loss", "--where", "tokens >= 1e9", "--json")
    )
    [overall] = res["overall"]  # three sizes of four kept, three seeds each
    assert (overall["variant"], overall["n_cells"], overall["n_pairs"]) == ("hadamard", 3, 9)
    assert overall["mean"] == pytest.approx(-0.02, abs=1e-6)
    assert {c["cell"]["tokens"] for c in res["cells"]} == {2 * 10**9, 3 * 10**9, 5 * 10**9}
    fit = fit_sweep("pairs", where="tokens >= 1e9", resample=False)
    assert fit.where == "tokens >= 1e9" and fit.n_used == 18
