"""CLI commands that watch sweeps: sweeps, status, logs, ui (docs/monitoring.md).

Registered onto `cli.main.app` after `cli.sweeps`, whose console and
error printer they share; ray and mlflow are imported inside the commands.
"""

from __future__ import annotations

import json
import os
import sys

import typer
from rich.table import Table

from scalelab.cli.completion import sweep_files
from scalelab.cli.console import err, fail
from scalelab.cli.sweep_view import STATUS_COLUMNS, shared_settings, status_cells, status_notes
from scalelab.cli.sweeps import door_errors, out
from scalelab.cli.wide_tables import print_table
from scalelab.contract.runs import TERMINAL, ExperimentTag, Status
from scalelab.orchestrator import door

STATUSES = (
    Status.RUNNING,
    Status.STARTING,
    Status.SCHEDULED,
    Status.FINISHED,
    Status.FAILED,
    Status.KILLED,
)
# MLflow 3's UI keeps "GenAI" or "Model training" as a browser setting (GenAI unless
# changed), whatever the experiment's kind tag; this query in a link picks model training
# the model-training mode and scalelab's saved view of the trials (orchestrator/ledger/ui_view.py),
# opened on its charts (the chart view is the address's, not the saved view's)
TRAINING_VIEW = (
    f"workflowType=machine_learning&viewStateShareKey={ExperimentTag.TRIALS_VIEW}"
    "&compareRunsMode=CHART"
)


def _status_table(state: door.SweepStatus) -> Table:
    rows = state.trials
    table = Table(title=f"sweep {state.sweep} ({state.experiment})")
    errors = any(r["error"] for r in rows)
    for col in STATUS_COLUMNS:  # the error folds over lines rather than being cut
        if col != "error" or errors:
            table.add_column(col, overflow="fold", ratio=3 if col == "error" else None)
    for r in rows:
        table.add_row(*status_cells(r)[: len(table.columns)])
    caption = done_text({s: sum(r["status"] == s for r in rows) for s in STATUSES}, len(rows))
    shared = shared_settings(rows)
    table.caption = f"{caption}; {shared}" if shared else caption
    return table


def done_text(counts: dict[str, int], total: int) -> str:
    """'3/24 done: 2 running, 3 finished': a sweep's trials by status (`counts`)."""
    done = sum(counts.get(s, 0) for s in TERMINAL)
    return f"{done}/{total} done: " + ", ".join(
        f"{counts[s]} {s.lower()}" for s in STATUSES if counts.get(s)
    )


def sweeps(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List the sweeps recorded in the tracking store, each with its trials by status."""
    from scalelab.contract.workdir import tracking_uri

    with door_errors():
        found = door.sweeps()
    if as_json:
        rows = [
            {"sweep": f.sweep, "experiment": f.experiment, "trials": sum(f.counts.values())}
            | {"counts": f.counts}
            for f in found
        ]
        print(json.dumps(rows))
        return
    if not found:
        out.print(f"no sweeps recorded in {tracking_uri()} yet; start one with: "
                  "scalelab submit sweeps/demo.yaml", highlight=False, soft_wrap=True)  # fmt: skip
        return
    table = Table(title=f"sweeps in {tracking_uri()}")
    table.add_column("sweep")
    table.add_column("trials", justify="right")
    for s in STATUSES:
        table.add_column(s.lower(), justify="right")
    table.add_column("state")
    for f in found:
        total = sum(f.counts.values())
        counts = [str(f.counts.get(s, 0)) for s in STATUSES]
        table.add_row(f.sweep, str(total), *counts, done_text(f.counts, total).split(":")[0])
    table.caption = "a sweep's trials: scalelab status SWEEP"
    print_table(out, table)


def status(
    sweep: str = typer.Argument(
        ..., help="Sweep name (or its YAML file).", autocompletion=sweep_files
    ),
    trials: list[str] = typer.Argument(
        None, help="Only these trials: run names or trial ids (a prefix will do).", metavar="TRIAL"
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    watch: bool = typer.Option(
        False, "--watch", "-w", help="Refresh the table until every trial is done."
    ),
    interval: float = typer.Option(5.0, "--interval", help="Seconds between refreshes (--watch)."),
) -> None:
    """Show a sweep's trials and their statuses (from MLflow)."""
    import time

    from rich.live import Live
    from rich.progress import BarColumn, Progress, TextColumn

    with door_errors():
        try:
            state = door.status(sweep, trials or None)
        except LookupError:  # not recorded yet: a submit may be checking and planning it
            busy = door.being_submitted(sweep)
            if busy is None:
                raise
            if as_json:
                print(json.dumps({"sweep": sweep, "submitting": busy.pid, "trials": []}))
            else:
                out.print(busy.line(), highlight=False, markup=False, soft_wrap=True)
            return
    rows = state.trials
    if as_json:
        print(json.dumps({"sweep": state.sweep, "trials": rows}))
        return
    if watch:
        with Live(_status_table(state), console=out, auto_refresh=False) as live:
            while not rows or any(r["status"] not in TERMINAL for r in rows):
                time.sleep(interval)
                with door_errors():
                    state = door.status(state.sweep, trials or None)
                rows = state.trials
                live.update(_status_table(state), refresh=True)
        return
    print_table(out, _status_table(state))
    for note in status_notes(rows):
        out.print(note, highlight=False, markup=False, soft_wrap=True)
    done = sum(r["status"] in TERMINAL for r in rows)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        console=out,
    ) as p:
        p.add_task(
            "finished" if done == len(rows) else "in progress", total=len(rows), completed=done
        )


def logs(
    sweep: str = typer.Argument(
        ..., help="Sweep name (or its YAML file).", autocompletion=sweep_files
    ),
    trial: str = typer.Argument(None, help="Run name, or trial id (a prefix will do)."),
    follow: bool = typer.Option(
        False,
        "--follow",
        "-f",
        help="Keep printing as it grows, until the trial ends (a trial not started yet is "
        "waited for).",
    ),
    timeout: float = typer.Option(
        None, "--timeout", min=0, help="With --follow: stop after this many seconds."
    ),
    lines: int = typer.Option(40, "--lines", "-n", help="How many of its last lines."),
    rank: int = typer.Option(
        0, "--rank", min=0, help="Another rank's log, of a trial of several ranks (0: the trial's)."
    ),
) -> None:
    """Print a trial's log (stdout and stderr of every attempt, rank 0's); without TRIAL,
    list them."""
    from scalelab.contract.workdir import trial_log
    from scalelab.jobs.tracking.trial_logs import follow as follow_log
    from scalelab.jobs.tracking.trial_logs import tail

    with door_errors():
        ledger = door.read(sweep)
    if trial is None:
        for rec in ledger.records().values():
            last = tail(rec.trial_id, 1) or "(no log here)"
            out.print(f"{rec.name:<28} {rec.trial_id}  {rec.status:<9} {trial_log(rec.trial_id)}")
            out.print(f"    {last}", highlight=False, markup=False)
        return
    with door_errors():
        rec = door.trial(ledger, trial)
    path = trial_log(rec.trial_id, rank)
    waiting = follow and not path.exists() and rec.status not in TERMINAL
    if not path.exists() and not waiting:
        others = sorted(p.name for p in path.parent.glob("*.log")) if path.parent.exists() else []
        where = f"; it has {', '.join(others)}" if rank and others else ""
        raise fail(f"no log at {path} (the trial has not run on this machine{where})")
    if waiting:  # as `tail -F`: its log is printed from its first line once it starts
        err.print(f"trial {rec.trial_id} is {rec.status}: waiting for its log at {path}",
                  highlight=False, markup=False)  # fmt: skip
        offset = 0
    else:
        offset = path.stat().st_size
        sys.stdout.write(tail(rec.trial_id, lines, end=offset, rank=rank) + "\n")
        sys.stdout.flush()
    if not follow:
        return
    status = rec.status

    def ended() -> bool:
        nonlocal status
        status = ledger.record(rec.run_id).status
        return status in TERMINAL

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    if follow_log(path, offset, ended, write, timeout_s=timeout):
        here = "" if path.exists() else " (it wrote no log here: it ran on another machine)"
        err.print(f"trial {rec.trial_id} ended: {status}{here}")
    else:
        err.print(f"stopped following after {timeout:g} s; trial {rec.trial_id} is {status}")


def ui(
    sweep: str = typer.Argument(None, help="A sweep: print the address of its runs."),
    port: int = typer.Option(5000, help="Port of the MLflow UI."),
    host: str = typer.Option("127.0.0.1", help="Interface (127.0.0.1: this machine only)."),
    workers: int = typer.Option(
        1, "--workers", min=1, help="Server processes (MLflow's default, 4, starts slowly)."
    ),
    no_login: bool = typer.Option(
        False, "--no-login", help="No login: every user of this machine can change your runs."
    ),
) -> None:
    """Start the MLflow UI on this machine's tracking store, behind a login (user admin, the
    password printed on the first start and kept in the work directory's ui/password)."""
    import ipaddress
    import socket

    from scalelab.contract.workdir import tracking_uri

    uri = tracking_uri()
    runs_view = ""
    if sweep:
        with door_errors():
            runs_view = f"#/experiments/{door.read(sweep).experiment_id()}/runs?{TRAINING_VIEW}"
    if uri.startswith("http"):
        out.print(f"the tracking server is already a UI: open {uri.rstrip('/')}/{runs_view}")
        return
    # a server on a busy port would say so only once MLflow is loaded: bind it here first
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as e:
        why = e.strerror or str(e)
        raise fail(
            f"cannot serve the MLflow UI on {host}:{port}: {why}; pick another --port"
        ) from None
    loopback = ipaddress.ip_address(address[0]).is_loopback
    if no_login:
        who = "anyone on this machine" if loopback else f"anyone who can reach {host}:{port}"
        err.print(
            f"warning: the MLflow UI has no login: {who} can read, "
            "change and delete every run (docs/reliability.md, Security)",
            highlight=False,
        )
    elif not loopback:
        err.print(
            f"warning: the MLflow UI on {host}:{port} is plain HTTP: its password and your runs "
            "cross the network unencrypted (docs/reliability.md, Security)",
            highlight=False,
        )
    from scalelab.cli import ui_server
    from scalelab.contract.workdir import artifact_root, scalelab_home

    found = None
    if not no_login:
        try:
            found = ui_server.login(scalelab_home())
        except OSError as e:
            raise fail(f"cannot keep the UI's login in {scalelab_home() / 'ui'}: {e}") from None
    env = {
        **os.environ,
        **ui_server.server_environment(uri, artifact_root()),
        **ui_server.login_environment(found),
    }
    # the server's own libraries warn of their deprecations: nothing the user can act on
    env.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
    cmd = ui_server.uvicorn_command(sys.executable, host, port, workers)
    out.print(f"MLflow UI on http://{host}:{port}/{runs_view} for {uri} (Ctrl-C to stop)")
    if found is not None and found.new:
        out.print(
            f"log in as {found.user}, password {found.password} "
            f"(kept in {found.password_file}, readable by you only)",
            highlight=False, soft_wrap=True,
        )  # fmt: skip
    elif found is not None:
        out.print(
            f"log in as {found.user}; the password: cat {found.password_file}",
            highlight=False, soft_wrap=True,
        )  # fmt: skip
    sys.stdout.flush()
    os.execve(sys.executable, cmd, env)


def register(app: typer.Typer) -> None:
    for fn in (sweeps, status, logs, ui):
        app.command()(fn)
