"""Host memory of building a model, side by side (issue 13, sharded construction).

    OMP_NUM_THREADS=1 python benchmarks/construction.py [--size 760M] [--dtype bf16]

Each variant runs in its own fresh process (one rank's construction: ranks build alike and
independently), which reports its peak RSS (getrusage) and wall time:
- `build`: models.build.build, the whole model in fp32 (jobs/train.py before; ZeRO-3 now);
- `materialised`: models.build.build_materialised on the CPU in `--dtype` (ZeRO 0-2 now).
On a GPU the materialised model lives on the device, so the host keeps only the process and
one module drawn in fp32; here the device is the CPU, so the row also shows the peak minus
the model's own bytes in `--dtype` (what a GPU rank's host would hold above the process).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

DTYPES = ("fp32", "bf16", "fp16")


def _one(variant: str, size: str, dtype: str) -> dict:
    import torch

    from models.build import build, build_materialised
    from models.config import ModelConfig

    cfg = ModelConfig.model_validate({"size": size, "vocab_size": 50257, "block_size": 1024})
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    torch.manual_seed(0)
    if variant == "build":
        model = build(cfg)
    else:
        model = build_materialised(cfg, "cpu", torch_dtype)
    seconds = time.perf_counter() - t0
    model_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"variant": variant, "seconds": seconds, "peak": peak, "before": before,
            "model_bytes": model_bytes}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", default="760M")
    parser.add_argument("--dtype", default="bf16", choices=DTYPES)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_one(args.child, args.size, args.dtype)))
        return
    rows = []
    for variant in ("build", "materialised"):
        out = subprocess.run(
            [sys.executable, __file__, "--size", args.size, "--dtype", args.dtype,
             "--child", variant],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    gib = 1024**3
    print(
        f"{args.size}, one rank, peak host RSS (GiB) and build time; materialised in {args.dtype}"
    )
    print(
        "| construction | peak RSS | after imports | model bytes | peak - imports - model | time |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        extra = r["peak"] - r["before"] - (r["model_bytes"] if r["variant"] != "build" else 0)
        print(f"| {r['variant']} | {r['peak'] / gib:.2f} | {r['before'] / gib:.2f} | "
              f"{r['model_bytes'] / gib:.2f} | {extra / gib:.2f} | {r['seconds']:.1f} s |")  # fmt: skip
    build_row, mat = rows
    print(f"peak RSS ratio materialised / build: {mat['peak'] / build_row['peak']:.2f}")


if __name__ == "__main__":
    main()
