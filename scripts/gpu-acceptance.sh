#!/usr/bin/env bash
# The GPU acceptance run: python -m benchmarks.acceptance on whatever Python is here
# (docs/benchmarks.md, "GPU acceptance").
#
#   scripts/gpu-acceptance.sh [--cpu] [--out DIR] [--only PART,...] [--skip PART,...] [--list]
#
# It needs no network and no install: the interpreter is $PYTHON, else .venv's, else
# python3 (a GPU node's own PyTorch); what that Python lacks comes from the wheel folder
# scripts/gpu-kit.sh built ($SCALELAB_KIT, default acceptance-kit/), installed into a scratch
# folder; scalelab is imported from this working tree. Compiler caches go to scratch too.
# Each part's rows are printed, and acceptance.json / acceptance.md rewritten, as it ends.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-$repo/.venv/bin/python}"
[ -x "$python" ] || python=python3

# one scratch folder per checkout: its `scalelab` link must not point at another tree
tree_key=$(printf %s "$repo" | cksum | cut -d' ' -f1)
scratch="${SCALELAB_SCRATCH:-${TMPDIR:-/tmp}/scalelab-acceptance-$(id -u)-$tree_key}"
mkdir -p "$scratch/import"
# `scalelab` is this working tree (pyproject.toml maps the package to the repository root)
ln -sfn "$repo" "$scratch/import/scalelab"
kit="${SCALELAB_KIT:-$repo/acceptance-kit}"
site="$scratch/site"
if [ -f "$kit/kit.json" ]; then
  rm -rf "$site"
  (cd "$repo" && "$python" -m benchmarks.acceptance.kit install "$kit" "$site")
fi
export PYTHONPATH="$scratch/import:$repo:$site${PYTHONPATH:+:$PYTHONPATH}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" PYTHONUNBUFFERED=1
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$scratch/triton-cache}"
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$scratch/inductor-cache}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0
cd "$repo"
exec "$python" -m benchmarks.acceptance "$@"
