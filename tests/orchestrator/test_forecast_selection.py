"""On the imported Chinchilla ladder: `results forecast --holdout-above-params N` (the
trials above N parameters forecast from the others), `--where` on forecast and plot
(applied before the hold-out), and any failure of a results command (here a corrupt Parquet
table) ending in one line and exit code 2, its traceback only with SCALELAB_DEBUG=1."""

from __future__ import annotations

import json

import pyarrow as pa
from click.testing import Result
from typer.testing import CliRunner

from scalelab.analysis.results import tables


def _invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    from scalelab.cli.main import app

    return CliRunner().invoke(app, ["results", *args], env=env)


def _json(*args: str) -> dict:
    res = _invoke(*args, "--json")
    assert res.exit_code == 0, (args, res.output)
    return json.loads(res.stdout)


def _refused(*args: str, env: dict[str, str] | None = None) -> str:
    """The one `error:` line a refused command prints (exit 2, no traceback)."""
    res = _invoke(*args, env=env)
    assert res.exit_code == 2, (args, res.output)
    assert "Traceback" not in res.output and len(res.stderr.splitlines()) == 1, res.stderr
    assert res.stderr.startswith("error: ")
    return res.stderr


def test_holdout_above_params_forecasts_the_larger_trials(chinchilla: pa.Table):
    n = chinchilla["n_params"].to_pylist()
    above = sorted(x for x in n if x > 5e9)
    assert 0 < len(above) < len(n)
    out = _json("forecast", "chin", "--holdout-above-params", "5e9")
    assert out["holdout"] == "runs above 5e+09 parameters"
    assert out["fitted_on"] == f"the {len(n) - len(above)} trials at or below 5e+09 parameters"
    assert [t["n_params"] for t in out["targets"]] == above  # in order of size
    assert all(t["actual"] is not None for t in out["targets"])


def test_holdout_above_params_refuses_in_one_line(chinchilla: pa.Table):
    sizes = sorted(set(chinchilla["n_params"].to_pylist()))
    says = _refused("forecast", "chin", "--holdout-above-params", "1e12")
    assert f"no trial above it (the largest has {sizes[-1]:.3g} parameters)" in says
    says = _refused("forecast", "chin", "--holdout-above-params", str(sizes[0]))
    assert "needs 2 or more sizes at or below it to fit a law, got 1" in says
    says = _refused("forecast", "chin", "--holdout-above-params", "1e9",
                    "--holdout-above-flops", "1e20")  # fmt: skip
    assert "give exactly one of" in says and "--holdout-above-params N" in says
    assert "expected a positive number" in _refused(
        "forecast", "chin", "--holdout-above-params", "-1"
    )


def test_forecast_where_applies_before_the_holdout(chinchilla: pa.Table):
    n, tokens = chinchilla["n_params"].to_pylist(), chinchilla["tokens"].to_pylist()
    kept = [(x, t) for x, t in zip(n, tokens, strict=True) if t >= 10**9]
    assert len(kept) < len(n) and max(tokens) > 2**24  # int64 beyond 2^24
    out = _json("forecast", "chin", "--where", "tokens >= 1e9", "--holdout-above-params", "5e9")
    assert sorted(t["n_params"] for t in out["targets"]) == sorted(x for x, _ in kept if x > 5e9)
    assert out["fitted_on"].startswith(f"the {sum(x <= 5e9 for x, _ in kept)} trials")
    # the filter comes first: above 5e9 parameters there is then nothing to hold out
    says = _refused("forecast", "chin", "--where", "n_params <= 5e9",
                    "--holdout-above-params", "5e9")  # fmt: skip
    assert "--holdout-above-params 5e+09: no trial above it" in says
    assert "no trial of 'chin' matches" in _refused(
        "forecast", "chin", "--where", "tokens > 1e99", "--flops", "1e22"
    )


def test_plot_takes_where(chinchilla: pa.Table):
    res = _invoke("plot", "chin", "--resamples", "5", "--where", "tokens >= 1e9")
    assert res.exit_code == 0, res.output
    assert any(line.endswith(".png") for line in res.stdout.split())
    says = _refused("plot", "chin", "--resamples", "5", "--where", "tokens >= 1e99")
    assert "--where 'tokens >= 1e99': no trial of sweep 'chin' matches" in says


def test_an_unexpected_failure_is_one_line_and_its_traceback_on_demand(chinchilla: pa.Table):
    (part,) = tables.partition_dir(tables.TRIALS, "chin").glob("*.parquet")
    part.write_bytes(b"not parquet")  # a table cut short: pyarrow's ArrowInvalid
    for command in ("query", "fit"):
        says = _refused(command, "chin")
        assert says.startswith(f"error: results {command} failed: ArrowInvalid: ")
        assert "SCALELAB_DEBUG=1" in says
    res = _invoke("fit", "chin", env={"SCALELAB_DEBUG": "1"})
    assert res.exit_code == 2
    assert "Traceback (most recent call last)" in res.stderr and "ArrowInvalid" in res.stderr
    assert res.stderr.splitlines()[-1].startswith("error: results fit failed: ArrowInvalid")
