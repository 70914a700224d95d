"""The training job's speed defaults measured side by side on this machine (issue 13).

    OMP_NUM_THREADS=1 python benchmarks/speed_defaults.py [--repeats 30] [--compile]

1. AdamW step over a model's parameters (stage 0, fp32: the optimizer runs on the module's
   own tensors): torch's per-tensor loop (the old default) vs foreach vs fused.
2. LM head + cross-entropy, forward and backward, with GPT-2's 50257-token vocabulary vs
   the same padded to 50304 (models/vocab.py: the GEMM over 50304 rows, logits sliced).
3. With --compile: forward + backward of the model eager vs torch.compile (after warm-up),
   and the compile time.
Medians of per-call times, alternating the variants so load affects both alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from scalelab.models.build import build  # noqa: E402
from scalelab.models.config import ModelConfig  # noqa: E402
from scalelab.models.vocab import padded_vocab_size  # noqa: E402


def _median_ms(fns: dict[str, callable], repeats: int) -> dict[str, float]:
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: 1e3 * statistics.median(ts[2:]) for name, ts in times.items()}


def adamw(size: str, repeats: int) -> None:
    cfg = ModelConfig(size=size, vocab_size=256, block_size=128)
    fns = {}
    for name, kw in {"loop": {"foreach": False}, "foreach": {"foreach": True},
                     "fused": {"fused": True}}.items():  # fmt: skip
        model = build(cfg)
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, **kw)
        fns[name] = opt.step
    ms = _median_ms(fns, repeats)
    n = sum(p.numel() for p in build(cfg).parameters())
    tensors = len(list(build(cfg).parameters()))
    print(f"AdamW step, {size} ({n / 1e6:.1f}M parameters in {tensors} tensors), median ms:")
    for name, v in ms.items():
        print(f"  {name:8s} {v:8.2f}  ({ms['loop'] / v:.2f}x the loop)")


def lm_head(repeats: int, d: int = 256, tokens: int = 512) -> None:
    vocab = 50257
    h = torch.randn(tokens, d, requires_grad=True)
    y = torch.randint(0, vocab, (tokens,))
    fns = {}
    for name, rows in {"50257": vocab, "50304 padded": padded_vocab_size(vocab)}.items():
        w = torch.randn(rows, d, requires_grad=True)

        def step(w=w):
            logits = (h @ w.t())[:, :vocab]
            F.cross_entropy(logits, y).backward()

        fns[name] = step
    ms = _median_ms(fns, repeats)
    print(f"LM head + cross-entropy fwd+bwd, {tokens} tokens x d={d}, median ms:")
    for name, v in ms.items():
        print(f"  {name:13s} {v:8.2f}  ({ms['50257'] / v:.2f}x unpadded)")


def compiled(size: str, repeats: int) -> None:
    cfg = ModelConfig(size=size, vocab_size=256, block_size=128)
    torch.manual_seed(0)
    eager = build(cfg)
    fast = build(cfg)
    fast.load_state_dict(eager.state_dict())
    t0 = time.perf_counter()
    fast.compile()
    x = torch.randint(0, 256, (8, 128))
    fast(x, x).loss.backward()
    first = time.perf_counter() - t0
    fns = {
        "eager": lambda: eager(x, x).loss.backward(),
        "compiled": lambda: fast(x, x).loss.backward(),
    }
    ms = _median_ms(fns, repeats)
    print(
        f"forward + backward, {size}, 8 x 128 tokens, median ms (compile + first call {first:.0f} s):"
    )
    for name, v in ms.items():
        print(f"  {name:8s} {v:8.2f}  ({ms['eager'] / v:.2f}x eager)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--size", default="mini")
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), load {os.getloadavg()}")
    adamw(args.size, args.repeats)
    lm_head(args.repeats)
    if args.compile:
        compiled(args.size, args.repeats)


if __name__ == "__main__":
    main()
