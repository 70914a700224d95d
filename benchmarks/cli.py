"""How long the `scalelab` command takes to answer, against issue 27's goals: each command's
CPU time (user + system, the process and its children) and wall time, side by side with
`python -c pass` and `python -c "import mlflow"`, medians of a few repeats, in one run.

Needs a recorded sweep that has ended (`make demo` once: sweep `demo`; `cancel` of an
ended sweep changes nothing), in $SCALELAB_HOME (default ./scalelab-runs) or
MLFLOW_TRACKING_URI. `scalelab ui` is timed from its start to the first
HTTP answer of the MLflow UI (wall only: the server keeps running until stopped).

    python benchmarks/cli.py [--repeats 5] [--sweep demo] [--file sweeps/demo.yaml]
    python benchmarks/cli.py --only dry-run     # rows whose label has this; no sweep needed
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# issue 27: < 1 s CPU on a quiet machine for status, logs, cancel, --help and completion;
# < 2 s for the demo's dry-run; the UI answers within 5 s
CPU_GOAL_S = 1.0
DRY_RUN_GOAL_S = 2.0
UI_GOAL_S = 5.0


def scalelab() -> list[str]:
    exe = Path(sys.executable).with_name("scalelab")
    return [str(exe)] if exe.exists() else [shutil.which("scalelab") or "scalelab"]


def commands(sweep: str, sweep_file: str) -> list[tuple[str, list[str], dict[str, str], float]]:
    """(label, argv, extra environment, CPU goal in s; 0: a reference, no goal)."""
    cli, py = scalelab(), sys.executable
    complete = {
        "_SCALELAB_COMPLETE": "complete_bash",
        "COMP_WORDS": "scalelab submit swe",
        "COMP_CWORD": "2",
    }
    return [
        ("python -c pass", [py, "-c", "pass"], {}, 0.0),
        ('python -c "import mlflow"', [py, "-c", "import mlflow"], {}, 0.0),
        ("scalelab --help", [*cli, "--help"], {}, CPU_GOAL_S),
        ("completion (submit swe<TAB>)", cli, complete, CPU_GOAL_S),
        (f"scalelab status {sweep}", [*cli, "status", sweep], {}, CPU_GOAL_S),
        (f"scalelab logs {sweep}", [*cli, "logs", sweep], {}, CPU_GOAL_S),
        (f"scalelab cancel {sweep}", [*cli, "cancel", sweep], {}, CPU_GOAL_S),
        (
            f"scalelab submit {sweep_file} --dry-run",
            [*cli, "submit", sweep_file, "--dry-run"],
            {},
            DRY_RUN_GOAL_S,
        ),
    ]


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """(CPU s of the process and every child it waited for, wall s, exit code)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(
        argv, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        print(f"  ! {' '.join(argv)} exited {proc.returncode}: {proc.stderr.decode()[-300:]}")
    return cpu, wall, proc.returncode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ui_answer_s(limit_s: float = 120.0, mlflow_alone: bool = False) -> float | None:
    """Seconds from starting `scalelab ui` (or MLflow's own `mlflow server` on the same
    store, one worker) to the UI's first HTTP answer."""
    port = free_port()
    if mlflow_alone:
        store = subprocess.run(
            [sys.executable, "-c", "from scalelab.contract.workdir import tracking_uri as t; print(t())"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        argv = [sys.executable, "-m", "mlflow", "server", "--workers", "1",
                "--backend-store-uri", store, "--port", str(port)]  # fmt: skip
    else:
        argv = [*scalelab(), "ui", "--port", str(port)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=os.environ | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
    )
    try:
        while time.perf_counter() - t0 < limit_s and proc.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as r:
                    if r.status == 200:
                        return time.perf_counter() - t0
            except OSError:
                time.sleep(0.05)
        return None
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--sweep", default="demo")
    ap.add_argument("--file", default="sweeps/demo.yaml")
    ap.add_argument("--no-ui", action="store_true", help="Skip timing `scalelab ui`.")
    ap.add_argument(
        "--only", action="append", default=[], help="Time only the rows whose label has this."
    )
    args = ap.parse_args()
    os.chdir(ROOT)
    rows = [c for c in commands(args.sweep, args.file) if any(o in c[0] for o in args.only or [""])]
    if not any(label.startswith(READS_THE_SWEEP) for label, *_ in rows):
        run(rows, args.repeats, ui=False)
        return
    shown = subprocess.run([*scalelab(), "status", args.sweep, "--json"], capture_output=True)
    if shown.returncode != 0:
        sys.exit(f"no recorded sweep {args.sweep!r} to read (make demo): {shown.stderr[-300:]}")
    live = [
        t for t in json.loads(shown.stdout)["trials"] if t["status"] in ("RUNNING", "SCHEDULED")
    ]
    if live:  # `cancel` would cancel them: time it on a sweep that has ended
        sys.exit(f"sweep {args.sweep} has {len(live)} live trials; run this once it has ended")
    run(rows, args.repeats, ui=not args.no_ui and not args.only)


READS_THE_SWEEP = ("scalelab status", "scalelab logs", "scalelab cancel")


def run(rows: list, repeats: int, ui: bool) -> None:
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load {os.getloadavg()}")
    print(f"medians of {repeats} runs (after one warm-up run each)\n")
    header = f"{'command':<44} {'CPU s':>7} {'wall s':>7} {'goal':>8}  met"
    print(header)
    print("-" * len(header))
    for label, argv, env, goal in rows:
        timed(argv, env)  # warm the file cache and .pyc files
        runs = [timed(argv, env) for _ in range(repeats)]
        cpu = statistics.median(r[0] for r in runs)
        wall = statistics.median(r[1] for r in runs)
        ok = all(r[2] == 0 for r in runs)
        goal_cell = f"{goal:g} CPU" if goal else ""
        met = ("yes" if cpu < goal else "no") if goal else ""
        print(
            f"{label:<44} {cpu:7.2f} {wall:7.2f} {goal_cell:>8}  {met}{'' if ok else ' (failed)'}"
        )
    if ui:  # taken in turns, so that a change in load falls on both alike
        answers: dict[bool, list] = {False: [], True: []}
        for _ in range(max(1, repeats // 2)):
            for alone in (True, False):
                answers[alone].append(ui_answer_s(mlflow_alone=alone))
        for alone, label in ((True, "mlflow server --workers 1 (same store)"),
                             (False, "scalelab ui: first HTTP answer")):  # fmt: skip
            got = [a for a in answers[alone] if a is not None]
            wall = statistics.median(got) if got else float("nan")
            ok = got and len(got) == len(answers[alone]) and wall < UI_GOAL_S
            goal = "" if alone else f"{UI_GOAL_S:g} wall  {'yes' if ok else 'no'}"
            print(f"{label:<44} {'':>7} {wall:7.2f} {goal:>8}")
    print(f"\nload at the end {os.getloadavg()}")


if __name__ == "__main__":
    main()
