"""`results import` questions what it reads: size labels a person can read (N grouped to 3
significant figures, even across a rounding boundary; a file's own labels kept) and plots
drawn per size."""

from __future__ import annotations

from pathlib import Path

import pytest

from scalelab.analysis.results import store
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
    return store.read_table(store.TRIALS, sweep).to_pylist()


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
    fit = fit_table(store.read_table(store.TRIALS, "chin"), "chin", resample=False)
    figure = loss_vs_params(fit)
    [line] = [x for x in figure.axes[0].get_lines() if "best per size" in x.get_label()]
    x, y = line.get_data()
    assert len(x) == 43 and all(a < b for a, b in zip(x, x[1:], strict=False))
    rows = _trials("chin")
    smallest = [r["final_val_loss"] for r in rows if r["size"] == "57.3M"]
    assert y[0] == min(smallest)
