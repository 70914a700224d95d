"""`python -m benchmarks.acceptance` (scripts/gpu-acceptance.sh): the parts of parts.py in
turn, each in a process of its own under its time budget. After each part its rows are
printed and acceptance.json / acceptance.md rewritten (atomically), so a run cut off
keeps every part that finished. Exit code 0 when nothing failed, 1 otherwise, 2 on bad
arguments or without a GPU (and without --cpu)."""

from __future__ import annotations

import argparse
import ctypes
import importlib.metadata
import importlib.util
import json
import os
import platform
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.acceptance.checks import Check
from benchmarks.acceptance.part import failure
from benchmarks.acceptance.parts import PARTS, Part, select

_PR_SET_PDEATHSIG = 1


@dataclass
class Summary:
    """What acceptance.json holds, rewritten after every part."""

    mode: str
    environment: dict[str, str]
    missing: dict[str, list[str]]  # part -> modules this Python lacks
    parts: list[dict] = field(default_factory=list)  # name, status, seconds, budget_s
    checks: list[Check] = field(default_factory=list)

    def write(self, out: Path) -> None:
        body = asdict(self)
        for name, text in (("acceptance.json", json.dumps(body, indent=2)),
                           ("acceptance.md", markdown(self))):  # fmt: skip
            tmp = out / f".{name}.tmp"
            tmp.write_text(text + "\n")
            tmp.replace(out / name)


def row(c: Check) -> str:
    cells = (text.replace("|", "\\|") for text in (c.name, c.goal, c.status, c.measured))
    return "| " + " | ".join(cells) + " |"


def markdown(s: Summary) -> str:
    lines = [f"# GPU acceptance ({s.mode})", "",
             ", ".join(f"{k} {v}" for k, v in s.environment.items()), "",
             "| check | goal | status | measured |", "|---|---|---|---|"]  # fmt: skip
    lines += [row(c) for c in s.checks]
    lines += ["", "| part | status | seconds | budget s |", "|---|---|---:|---:|"]
    lines += [f"| {p['name']} | {p['status']} | {p['seconds']} | {p['budget_s']} |"
              for p in s.parts]  # fmt: skip
    return "\n".join(lines)


def environment(cpu: bool) -> dict[str, str]:
    env = {"python": platform.python_version()}
    for dist in ("torch", "triton", "deepspeed", "pydantic"):
        try:
            env[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            env[dist] = "missing"
    if not cpu:
        import torch

        env["device"] = torch.cuda.get_device_name()
        env["cuda"] = str(torch.version.cuda)
    return env


def missing_modules(parts: list[Part], cpu: bool) -> dict[str, list[str]]:
    missing = {}
    for p in parts:
        needs = p.needs if cpu else p.needs + p.gpu_needs
        if gone := [m for m in needs if importlib.util.find_spec(m) is None]:
            missing[p.name] = gone
    return missing


def _child_setup() -> None:
    """The part's process: a process group of its own (a timed-out part is killed with
    whatever it started), and killed if this runner dies (Linux)."""
    os.setsid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass


def run_part(part: Part, cpu: bool, out: Path, budget_s: float) -> tuple[list[Check], str]:
    """The part's checks and how it ended: done, timed out or crashed."""
    result = out / "parts" / f"{part.name}.json"
    log = out / "logs" / f"{part.name}.log"
    for folder in (result.parent, log.parent):
        folder.mkdir(parents=True, exist_ok=True)
    result.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "benchmarks.acceptance.part", part.name, "--out",
           str(out / "work" / part.name), "--result", str(result)] + (["--cpu"] if cpu else [])  # fmt: skip
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, preexec_fn=_child_setup)
        try:
            proc.wait(timeout=budget_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            why = f"stopped after its budget of {budget_s:.0f} s (log: {log})"
            return [Check(part.name, f"ends within {budget_s:.0f} s", "fail", why)], "timed out"
    if proc.returncode == 0 and result.exists():
        return [Check(**c) for c in json.loads(result.read_text())], "done"
    tail = " / ".join(log.read_text(errors="replace").strip().splitlines()[-3:])[-400:]
    crash = RuntimeError(f"exit code {proc.returncode}: {tail} (log: {log})")
    return [failure(part.name, crash)], "crashed"


def parse(argv: list[str] | None) -> argparse.Namespace:
    names = ", ".join(p.name for p in PARTS)
    parser = argparse.ArgumentParser(
        prog="scripts/gpu-acceptance.sh",
        description="scalelab's GPU acceptance run: each part answers GPU questions with a "
        f"goal and pass, fail or skipped. Parts, in order: {names}.",
    )
    parser.add_argument("--cpu", action="store_true", help="the CPU-sized path (CI)")
    parser.add_argument("--out", type=Path, default=Path("acceptance"), help="summary folder")
    parser.add_argument("--only", default="", help="comma-separated parts to run")
    parser.add_argument("--skip", default="", help="comma-separated parts not to run")
    parser.add_argument("--budget-scale", type=float, default=1.0,
                        help="multiply every part's time budget (default 1)")  # fmt: skip
    parser.add_argument("--list", action="store_true", help="list the parts and exit")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    split = lambda text: [n for n in text.split(",") if n]  # noqa: E731
    try:
        parts = select(split(args.only), split(args.skip))
    except ValueError as e:
        print(f"gpu-acceptance: {e}", file=sys.stderr)
        return 2
    if args.list:
        for p in PARTS:
            print(f"{p.name:14} ~{p.gpu_estimate_s:>4} s on one H100 (budget {p.gpu_budget_s} s)"
                  f"  {p.question}")  # fmt: skip
        return 0
    if args.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    try:
        import torch
    except ModuleNotFoundError:
        print("gpu-acceptance: this Python has no torch", file=sys.stderr)
        return 2
    if not args.cpu and not torch.cuda.is_available():
        print("gpu-acceptance: no CUDA device here; use --cpu for the CPU path", file=sys.stderr)
        return 2
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    summary = Summary(
        "cpu" if args.cpu else "gpu", environment(args.cpu), missing_modules(parts, args.cpu)
    )
    budgets = {p.name: (p.cpu_budget_s if args.cpu else p.gpu_budget_s) * args.budget_scale
               for p in parts}  # fmt: skip
    summary.parts = [{"name": p.name, "status": "pending", "seconds": 0,
                      "budget_s": round(budgets[p.name])} for p in parts]  # fmt: skip
    print("preflight: " + ", ".join(f"{k} {v}" for k, v in summary.environment.items()))
    gaps = "; ".join(f"{n} needs {', '.join(m)}" for n, m in summary.missing.items())
    print(
        f"preflight: missing modules: {gaps}" if gaps else "preflight: every part's imports found"
    )
    summary.write(out)
    for i, part in enumerate(parts):
        summary.parts[i]["status"] = "running"
        summary.write(out)
        t0 = time.monotonic()
        checks, ended = run_part(part, args.cpu, out, budgets[part.name])
        summary.parts[i] |= {"status": ended, "seconds": round(time.monotonic() - t0, 1)}
        summary.checks += checks
        summary.write(out)
        for c in checks:
            print(f"[{c.status}] {c.name}: {c.measured}", flush=True)
    print(f"\n{markdown(summary)}\n\nwritten: {out / 'acceptance.json'}, {out / 'acceptance.md'}")
    return 1 if any(c.status == "fail" for c in summary.checks) else 0


if __name__ == "__main__":
    sys.exit(main())
