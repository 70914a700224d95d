"""`scalelab results import` on large ladders: wall time and peak memory of the command
(a process of its own, measured by wait4) importing N rows of CSV, JSON Lines and Parquet
into a fresh work directory. Run:

    python benchmarks/import_scale.py [--rows 100000,1000000] [--formats csv,jsonl,parquet]
    python benchmarks/import_scale.py --scalelab before=/tmp/old --scalelab after=/work

`--scalelab NAME=DIR` runs the command with DIR first on PYTHONPATH (DIR/scalelab is a
checkout of the package), so that two versions are measured side by side on the same
files; without it, the installed package. The files are written once to $SCALELAB_BENCH_DIR
(default /tmp/scalelab-bench-import) and reused. Results: docs/benchmarks.md, "results
import at scale".
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(os.environ.get("SCALELAB_BENCH_DIR", "/tmp/scalelab-bench-import"))


def ladder(rows: int, fmt: str) -> Path:
    """`rows` distinct trials (N, tokens, loss, seed, variant), written once."""
    path = ROOT / f"ladder{rows}.{fmt}"
    if path.exists():
        return path
    import pyarrow as pa
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    table = pa.table({
        "N": rng.integers(10**6, 10**9, rows), "tokens": rng.integers(10**8, 10**10, rows),
        "loss": np.round(rng.uniform(2, 4, rows), 5), "seed": np.arange(rows),
        "variant": np.where(np.arange(rows) % 2, "dense", "hadamard"),
    })  # fmt: skip
    ROOT.mkdir(parents=True, exist_ok=True)
    if fmt == "csv":
        pcsv.write_csv(table, path)
    elif fmt == "parquet":
        pq.write_table(table, path)
    else:
        with open(path, "w") as f:
            for r in table.to_pylist():
                f.write(
                    f'{{"N": {r["N"]}, "tokens": {r["tokens"]}, "loss": {r["loss"]}, '
                    f'"seed": {r["seed"]}, "variant": "{r["variant"]}"}}\n'
                )
    return path


def measure(path: Path, pythonpath: str | None, timeout_s: float) -> tuple[str, float, float]:
    """(outcome, wall seconds, peak RSS in MiB) of one `results import` in a process."""
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "SCALELAB_HOME": home}
        env.pop("MLFLOW_TRACKING_URI", None)
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        cmd = [sys.executable, "-m", "scalelab", "results", "import", str(path), "--sweep", "big"]
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while True:  # wait4, not Popen.wait: the child's own peak RSS
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                code = os.waitstatus_to_exitcode(status)
                outcome = "imported" if code == 0 else f"exit {code}"
                break
            if time.perf_counter() - start > timeout_s:
                proc.kill()
                _, _, usage = os.wait4(proc.pid, 0)
                outcome = f"still running at {timeout_s:.0f} s"
                break
            time.sleep(0.05)
        proc.returncode = 0  # reaped above
        return outcome, time.perf_counter() - start, usage.ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="100000,1000000")
    parser.add_argument("--formats", default="csv,jsonl,parquet")
    parser.add_argument("--scalelab", action="append", default=[], metavar="NAME=DIR")
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    versions = [tuple(v.split("=", 1)) for v in args.scalelab] or [("installed", None)]
    load = os.getloadavg()[0]
    print(f"# {os.cpu_count()} CPUs, load average {load:.1f} at the start")
    print("| rows | format | version | outcome | wall (s) | peak RSS (MiB) |")
    print("|---|---|---|---|---|---|")
    for rows in (int(r) for r in args.rows.split(",")):
        for fmt in args.formats.split(","):
            path = ladder(rows, fmt)
            for name, pythonpath in versions:
                outcome, wall, rss = measure(path, pythonpath, args.timeout)
                print(f"| {rows:,} | {fmt} | {name} | {outcome} | {wall:.1f} | {rss:,.0f} |",
                      flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
