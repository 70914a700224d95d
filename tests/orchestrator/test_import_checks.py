"""`results import` questions what it reads: size labels a person can read (N grouped to 3
significant figures, even across a rounding boundary; a file's own labels kept) and plots
drawn per size; text that is not UTF-8 refused in one line that says where; identical rows
refused unless `--duplicates` says what they are; flops that contradict 6·N·D refused at
their line; a folder refused as a folder."""

from __future__ import annotations

import codecs
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from scalelab.analysis.results import ResultsError, tables
from scalelab.analysis.results.imports import import_file

LADDER = Path(__file__).resolve().parents[2] / "benchmarks" / "data" / "chinchilla_ladder.csv"
HEADER = "N,tokens,loss,variant\n"


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A work directory with no MLflow database: nothing to sync from."""
    monkeypatch.setenv("SCALELAB_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path / "home"


def _trials(sweep: str) -> list[dict]:
    return tables.read_table(tables.TRIALS, sweep).to_pylist()


def _cli(*args: str) -> tuple[int, str]:
    from scalelab.cli.main import app

    res = CliRunner().invoke(app, ["results", "import", *args])
    return res.exit_code, res.output


# -- size labels ----------------------------------------------------------------------------


def test_sizes_are_groups_of_n_to_three_significant_figures(home: Path, tmp_path: Path):
    csv = tmp_path / "near.csv"
    ns = (73_824_671, 73_824_689, 73_849_999, 73_850_001, 999_950_000, 124_000_000, 124_400_000)
    csv.write_text(HEADER + "".join(f"{n},{2e9 + i},3.{i},dense\n" for i, n in enumerate(ns)))
    import_file(csv, "near")
    size_of = {r["n_params"]: r["size"] for r in _trials("near")}
    # 73.849999M rounds to 73.8M and 73.850001M to 73.9M: one group all the same
    assert {size_of[n] for n in ns[:4]} == {"73.8M"}
    assert size_of[999_950_000] == "1B"  # never "1e+03M"
    assert size_of[124_000_000] == "124M" and size_of[124_400_000] == "124M"


def test_the_chinchilla_ladder_has_43_sizes_and_a_files_labels_are_kept(home: Path, tmp_path: Path):
    import_file(LADDER, "chin")
    rows = _trials("chin")
    sizes = {r["size"] for r in rows}
    assert len(rows) == 245 and len(sizes) == 43
    assert {"57.3M", "73.8M", "16.2B"} <= sizes
    for label in sizes:  # one label, one cluster of N within 0.1%
        ns = [r["n_params"] for r in rows if r["size"] == label]
        assert max(ns) / min(ns) < 1.001, label
    own = tmp_path / "own.csv"
    own.write_text("N,tokens,loss,size\n73824671,2e9,3.2,small\n73824689,4e9,3.1,small-long\n")
    import_file(own, "own")
    assert sorted(r["size"] for r in _trials("own")) == ["small", "small-long"]


def test_loss_vs_params_draws_one_point_per_size(home: Path):
    from scalelab.analysis.plots import loss_vs_params
    from scalelab.analysis.results.fit import fit_table

    import_file(LADDER, "chin")
    fit = fit_table(tables.read_table(tables.TRIALS, "chin"), "chin", resample=False)
    figure = loss_vs_params(fit)
    [line] = [x for x in figure.axes[0].get_lines() if "best per size" in x.get_label()]
    x, y = line.get_data()
    assert len(x) == 43 and all(a < b for a, b in zip(x, x[1:], strict=False))
    rows = _trials("chin")
    smallest = [r["final_val_loss"] for r in rows if r["size"] == "57.3M"]
    assert y[0] == min(smallest)


# -- encodings and paths --------------------------------------------------------------------


def test_text_not_utf8_is_refused_in_one_line_that_says_where(home: Path, tmp_path: Path):
    latin = tmp_path / "latin.csv"
    latin.write_bytes((HEADER + "1e8,2e9,3.1,dense\n2e8,2e9,3.0,dénse\n").encode("latin-1"))
    with pytest.raises(ResultsError) as e:
        import_file(latin, "enc")
    assert (
        str(e.value)
        == f"{latin}:3: byte 0xe9 at byte 14 of the line is not UTF-8: save the file as UTF-8"
    )
    text = HEADER + "".join(f"{n}e8,2e9,3.1,dense\n" for n in range(1, 30))
    for codec, name in (("utf-16", "UTF-16"), ("utf-16-le", "UTF-16"), ("utf-32", "UTF-32")):
        wide = tmp_path / f"{codec}.csv"
        wide.write_bytes(text.encode(codec))
        code, out = _cli(str(wide), "--sweep", "enc")
        assert code == 2 and out.strip() == f"error: {wide}: {name} text: save it as UTF-8", out
    lines = tmp_path / "latin.jsonl"
    lines.write_bytes('{"N": 1e8, "D": 2e9, "loss": 3.1, "variant": "dénse"}\n'.encode("latin-1"))
    code, out = _cli(str(lines), "--sweep", "enc")
    assert code == 2 and "Traceback" not in out and f"{lines}:1: byte 0xe9" in out
    assert tables.read_table(tables.TRIALS, "enc") is None


def test_utf8_with_a_bom_and_utf8_bytes_in_parquet_are_read(home: Path, tmp_path: Path):
    bom = tmp_path / "bom.csv"
    bom.write_bytes(codecs.BOM_UTF8 + (HEADER + "1e8,2e9,3.1,dénse\n").encode())
    import_file(bom, "bom")
    assert [r["variant"] for r in _trials("bom")] == ["dénse"]
    table = tmp_path / "bytes.parquet"
    binary = pa.array([b"dense", b"hadamard"], pa.binary())
    pq.write_table(pa.table({"N": [1e8, 1e8], "D": [2e9, 2e9], "loss": [3.1, 3.0],
                             "variant": binary}), table)  # fmt: skip
    import_file(table, "bytes")
    assert sorted(r["variant"] for r in _trials("bytes")) == ["dense", "hadamard"]
    pq.write_table(pa.table({"N": [1e8, 1e8], "D": [2e9, 2e9], "loss": [3.1, 3.0],
                             "variant": pa.array([b"dense", b"d\xe9nse"])}), table)  # fmt: skip
    with pytest.raises(ResultsError, match=rf"{table}:row 2: variant b'd\\xe9nse' is not UTF-8"):
        import_file(table, "bytes")


def test_a_folder_is_refused_as_a_folder(home: Path, tmp_path: Path):
    folder = tmp_path / "x.csv"
    folder.mkdir()
    with pytest.raises(ResultsError, match=f"^{folder}: a folder, not a file"):
        import_file(folder, "dir")
    with pytest.raises(ResultsError, match="no such file"):
        import_file(tmp_path / "missing.csv", "dir")


# -- duplicates -----------------------------------------------------------------------------


def test_identical_rows_are_refused_unless_told_to_merge_or_keep(home: Path, tmp_path: Path):
    csv = tmp_path / "dup.csv"
    row, other = "1e8,2e9,3.1,dense\n", "2e8,2e9,3.0,dense\n"
    csv.write_text(HEADER + row + other + row + other + row)
    code, out = _cli(str(csv), "--sweep", "dup")
    assert code == 2, out
    assert f"{csv}:4: the same as line 2 in every field read" in out
    assert f"{csv}:5: the same as line 3 in every field read" in out
    assert f"{csv}:6: the same as line 2 in every field read" in out
    assert "--duplicates merge" in out and tables.read_table(tables.TRIALS, "dup") is None
    code, out = _cli(str(csv), "--sweep", "dup", "--duplicates", "merge")
    assert code == 0 and "imported 2 trials" in out and "3 repeated row(s) merged" in out, out
    assert sorted(r["name"] for r in _trials("dup")) == ["dup.csv:2", "dup.csv:3"]
    code, out = _cli(str(csv), "--sweep", "dup", "--duplicates", "keep")
    assert code == 0 and "imported 5 trials" in out and "3 repeated row(s) kept" in out, out
    assert len({r["trial_id"] for r in _trials("dup")}) == 5
    seeded = tmp_path / "seeds.jsonl"  # differing in one field read: not duplicates
    seeded.write_text('{"N": 1e8, "C": 1e18, "loss": 3, "seed": 0}\n'
                      '{"N": 1e8, "C": 1e18, "loss": 3, "seed": 1}\n'
                      '{"N": 1e8, "C": 1e18, "loss": 3, "seed": 1}\n')  # fmt: skip
    with pytest.raises(ResultsError, match=f"{seeded}:3: the same as line 2"):
        import_file(seeded, "dup")
    table = tmp_path / "dup.parquet"
    pq.write_table(pa.table({"N": [1e8, 1e8], "C": [1e18, 1e18], "loss": [3.0, 3.0]}), table)
    with pytest.raises(ResultsError, match=f"{table}:row 2: the same as row 1"):
        import_file(table, "dup")


def test_one_run_with_two_losses_is_said_and_seeded_replicates_are_not(home: Path, tmp_path: Path):
    rivals = tmp_path / "rivals.csv"
    rivals.write_text(HEADER + "1e8,2e9,3.1,dense\n2e8,2e9,3.0,dense\n1e8,2e9,3.2,dense\n")
    result = import_file(rivals, "rivals")
    [note] = [n for n in result.notes if "different losses" in n]
    assert note.startswith("1 run(s) appear more than once") and "N=1e+08 D=2e+09" in note
    assert result.n_rows == 3
    seeded = tmp_path / "seeded.jsonl"
    seeded.write_text('{"N": 1e8, "C": 1e18, "loss": 3.1, "seed": 0}\n'
                      '{"N": 1e8, "C": 1e18, "loss": 3.2, "seed": 1}\n')  # fmt: skip
    assert not [n for n in import_file(seeded, "seeded").notes if "different losses" in n]


# -- compute against 6ND --------------------------------------------------------------------


def test_flops_that_contradict_6nd_are_refused_at_their_line(home: Path, tmp_path: Path):
    csv = tmp_path / "flops.csv"
    csv.write_text(
        "N,tokens,flops,loss\n"
        "1e8,2e9,1.2e18,3.1\n"  # 6ND exactly
        "1e8,4e9,4.0e18,3.0\n"  # 6ND = 2.4e18: 1.67x, attention counted at a small size
        "1e8,8e9,1.6e18,2.9\n"  # forward only: 2ND, 1/3 of 6ND
        "1e8,1.6e10,9.6e21,2.8\n"  # 1000x: another unit
    )
    with pytest.raises(ResultsError) as e:
        import_file(csv, "flops")
    assert str(e.value).splitlines()[1:] == [
        f"{csv}:4: flops 1.6e+18 is 0.333x 6·N·D (4.8e+18): more than 2x apart; "
        "drop the flops or the tokens column to derive one from the other",
        f"{csv}:5: flops 9.6e+21 is 1000x 6·N·D (9.6e+18): more than 2x apart; "
        "drop the flops or the tokens column to derive one from the other",
    ]
    csv.write_text("N,tokens,flops,loss\n1e8,2e9,1.2e18,3.1\n1e8,4e9,4.0e18,3.0\n")
    result = import_file(csv, "flops")
    assert "flops are 1x to 1.67x 6·N·D (kept as given)" in str(result)
    assert sorted(r["flops"] for r in _trials("flops")) == [1.2e18, 4.0e18]


# -- a sweep with trained trials ---------------------------------------------------------


def test_a_sweep_with_trained_trials_takes_imported_rows_only_when_asked(
    home: Path, tmp_path: Path
):
    from synthetic_sweep import write_sweep

    from scalelab.analysis.results import sync

    write_sweep("trained", sizes=("nano",), tokens_per_param=(10, 20), steps=3)
    trained = sync("trained").n_trials
    csv = tmp_path / "pub.csv"
    csv.write_text(HEADER + "1e8,2e9,3.1,dense\n")
    code, out = _cli(str(csv), "--sweep", "trained")
    assert code == 2 and f"sweep 'trained' has {trained} trained trial(s)" in out, out
    assert "--join-trained" in out and "nothing imported" in out
    assert [r["curves_source"] for r in _trials("trained")] == ["local"] * trained
    code, out = _cli(str(csv), "--sweep", "trained", "--join-trained")
    assert code == 0 and f"imported 1 trials from {csv}" in out, out
    assert f"{trained} synced trials kept" in out
    assert (
        sorted(r["curves_source"] for r in _trials("trained")) == ["imported"] + ["local"] * trained
    )
    sync("trained")  # a sync keeps them; importing again replaces them, still only when asked
    assert _cli(str(csv), "--sweep", "trained")[0] == 2
    assert len(_trials("trained")) == trained + 1
