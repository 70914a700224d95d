#!/usr/bin/env bash
# One-command acceptance check (issue 13): `python -m benchmarks.acceptance`, which writes
# acceptance.json and acceptance.md. `--cpu` runs the CPU-sized path that CI runs.
#   scripts/gpu-acceptance.sh [--cpu] [--out DIR]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$repo/.venv/bin/python}"
[ -x "$python" ] || python=python3
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
exec "$python" -m benchmarks.acceptance "$@"
