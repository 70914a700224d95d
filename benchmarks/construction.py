"""Host memory of building a model, side by side (issue 13, sharded construction).

    OMP_NUM_THREADS=1 python benchmarks/construction.py [--size 760M] [--dtype bf16] [--ranks 2]

Each variant runs in fresh processes, `--ranks` of them at once (ranks on one node build
alike and independently, at the same time), each reporting its peak RSS (getrusage) and
wall time; the table shows each rank and their sum, the node's share:
- `build`: models.build.build, the whole model in fp32 (jobs/training/train.py before);
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

    from scalelab.models.build import build, build_materialised
    from scalelab.models.config import ModelConfig

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
    parser.add_argument("--ranks", type=int, default=1, help="processes building at once")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_one(args.child, args.size, args.dtype)))
        return
    ranks: dict[str, list[dict]] = {}
    for variant in ("build", "materialised"):
        cmd = [sys.executable, __file__, "--size", args.size, "--dtype", args.dtype]
        procs = [
            subprocess.Popen([*cmd, "--child", variant], stdout=subprocess.PIPE, text=True)
            for _ in range(args.ranks)
        ]
        outs = [p.communicate()[0] for p in procs]
        if any(p.returncode for p in procs):
            sys.exit(f"a {variant} rank failed (exit codes {[p.returncode for p in procs]})")
        ranks[variant] = [json.loads(out.strip().splitlines()[-1]) for out in outs]
    gib = 1024**3
    print(
        f"{args.size}, {args.ranks} rank(s) building at once, peak host RSS (GiB) and build "
        f"time; materialised in {args.dtype}"
    )
    print(
        "| construction | rank | peak RSS | after imports | model bytes "
        "| peak - imports - model | time |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for variant, rows in ranks.items():
        for i, r in enumerate(rows):
            model = r["model_bytes"] if variant != "build" else 0
            extra = r["peak"] - r["before"] - model
            print(f"| {variant} | {i} | {r['peak'] / gib:.2f} | {r['before'] / gib:.2f} | "
                  f"{r['model_bytes'] / gib:.2f} | {extra / gib:.2f} | {r['seconds']:.1f} s |")  # fmt: skip
        if len(rows) > 1:
            print(f"| {variant} | sum | {sum(r['peak'] for r in rows) / gib:.2f} | | | | |")
    peak = {v: sum(r["peak"] for r in rows) for v, rows in ranks.items()}
    print(f"peak RSS ratio materialised / build: {peak['materialised'] / peak['build']:.2f}")


if __name__ == "__main__":
    main()
