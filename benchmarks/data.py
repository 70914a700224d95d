"""Data preparation: throughput and memory of `scalelab data prepare` (jobs/data/prepare.py)
against the path jobs/data/trial.py took before issue 12, on the same generated text.

    nice -n 19 python benchmarks/data.py [--mb 200] [--small-mb 50] [--throughput-mb 24]

The corpus is generated from text that ships with Python (benchmarks/corpus.py) in
Hugging Face datasets layout (Parquet shards with a `text` column, like FineWeb), in a
temporary folder.

Table 1, throughput, on a `--throughput-mb` corpus, GPT-2 BPE and bytes side by side:
  today's path : datasets.load_dataset (not streaming) -> a Python list of every document
                 -> one-thread batch encoding into one Python list of ids -> numpy (what
                 jobs/data/trial.py did before issue 12, on rank 0 of a trial)
  new path     : Parquet row ranges (from the files' metadata) -> 1 or 2 tokeniser worker
                 processes that read and tokenise them -> the main process writes shards
Table 2, memory: the new path (GPT-2, 2 workers) on `--small-mb` and `--mb` corpora; peak
RSS is the largest sum over the main process and its workers (psutil, sampled every 50 ms).

Every row runs in a fresh process; times include starting the workers and loading the
vocabulary. Paste the output into docs/benchmarks.md ("Data preparation").
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LADDER_TOKENS = 112_946_315_264  # the 5.6B trial of sweeps/hadamard.yaml


def _peak_tree_rss(stop: threading.Event, out: list[float]) -> None:
    """out[0]: the largest RSS sum over this process and its children, every 50 ms; out[1]:
    this thread's own CPU seconds (kept out of the main process's). Listing the children
    scans every process on the machine, so it is done once a second, not every sample:
    done every 50 ms it took a CPU-second per ~20 s of wall time from the workers."""
    import psutil

    me, tree, listed = psutil.Process(), [], 0.0
    while not stop.is_set():
        if time.monotonic() - listed >= 1.0:
            tree, listed = [me, *me.children(recursive=True)], time.monotonic()
        total = 0
        for p in tree:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        out[0] = max(out[0], total)
        out[1] = time.thread_time()
        stop.wait(0.05)


def todays_path(files: list[str], tokenizer: str, cache: str) -> int:
    """jobs/data/trial.py before issue 12: load everything, tokenise on one thread, one list."""
    import datasets
    import numpy as np

    from scalelab.jobs.data.tokenizers import load_tokenizer

    ds = datasets.load_dataset("parquet", data_files=files, split="train", cache_dir=cache)
    docs = list(ds["text"])
    if tokenizer == "gpt2":  # it called tiktoken.get_encoding("gpt2"): tiktoken's own split
        from tiktoken_ext.openai_public import r50k_pat_str

        from scalelab.jobs.data.tokenizers import gpt2_encoding

        enc = gpt2_encoding(pat_str=r50k_pat_str)
        encode_batch = functools.partial(enc.encode_ordinary_batch, num_threads=1)
        vocab_size, sep = enc.n_vocab, [enc.eot_token]
    else:
        tok = load_tokenizer(tokenizer)
        encode_batch, vocab_size = tok.encode_batch, tok.vocab_size
        sep = [tok.eot] if tok.eot is not None else tok.encode_batch(["\n\n"])[0]
    ids = [i for doc in encode_batch(docs) for i in (*doc, *sep)]
    dtype = np.uint16 if vocab_size <= 2**16 else np.uint32
    np.asarray(ids, dtype=dtype).tofile(Path(cache) / "tokens.bin")
    return len(ids)


def new_path(corpus: str, tokenizer: str, workers: int, data: str) -> int:
    from scalelab.jobs.data.prepare import prepare_source
    from scalelab.jobs.data.sources import TextSource

    os.environ["SCALELAB_DATA"] = data
    _, m = prepare_source(TextSource.open(corpus, "text"), tokenizer, workers=workers)
    return m.train_tokens + m.validation.tokens


def one(spec: dict) -> dict:
    """Run one row in this (fresh) process: tokens, seconds, peak RSS of the process tree,
    and CPU seconds of this process and of its (reaped) worker processes."""
    stop, peak = threading.Event(), [0.0, 0.0]
    sampler = threading.Thread(target=_peak_tree_rss, args=(stop, peak), daemon=True)
    sampler.start()
    with tempfile.TemporaryDirectory(dir=spec["tmp"]) as tmp:
        t = time.perf_counter()
        if spec["path"] == "today":
            files = sorted(str(p) for p in Path(spec["corpus"], "data").glob("*.parquet"))
            tokens = todays_path(files, spec["tokenizer"], tmp)
        else:
            tokens = new_path(spec["corpus"], spec["tokenizer"], spec["workers"], tmp)
        seconds = time.perf_counter() - t
    stop.set()
    sampler.join()
    cpu = os.times()
    return {**spec, "tokens": tokens, "seconds": seconds, "peak_rss": peak[0],
            "main_cpu": cpu.user + cpu.system - peak[1], "sampler_cpu": peak[1],
            "worker_cpu": cpu.children_user + cpu.children_system}  # fmt: skip


def run_row(spec: dict) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    done = subprocess.run([sys.executable, __file__, "--one", json.dumps(spec)], env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode:
        raise SystemExit(f"row {spec} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=float, default=200, help="large corpus (memory table)")
    parser.add_argument("--small-mb", type=float, default=50, help="small corpus (memory)")
    parser.add_argument("--throughput-mb", type=float, default=24)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(json.loads(args.one))))
        return
    from benchmarks.corpus import write_corpus

    with tempfile.TemporaryDirectory(prefix="scalelab-bench-data-") as tmp:
        sizes = sorted({args.throughput_mb, args.small_mb, args.mb})
        corpora = {mb: str(write_corpus(Path(tmp) / f"corpus-{mb:g}mb", mb)) for mb in sizes}
        print(f"corpora generated in {tmp}: " + ", ".join(f"{mb:g} MB" for mb in sizes))
        print(_load("at the start"))
        throughput(corpora[args.throughput_mb], args.throughput_mb, tmp)
        print(_load("after the throughput table"))
        memory({mb: corpora[mb] for mb in (args.small_mb, args.mb)}, tmp)
        print(_load("at the end"))


def _load(when: str) -> str:
    """The machine's load average: the numbers are only comparable on a quiet machine."""
    one, five, _ = os.getloadavg()
    return f"\nload average {when}: {one:.2f} (1 min), {five:.2f} (5 min)"


def throughput(corpus: str, mb: float, tmp: str) -> None:
    print(f"\nThroughput, {mb:g} MB of text, {os.cpu_count()} CPUs\n")
    print("| tokenizer | path | workers | tokens | seconds | M tokens/s | x today | CPU s "
          "main + workers | peak RSS MiB |\n|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    rows = {}
    for tokenizer in ("gpt2", "byte"):
        for path, workers in (("today", 0), ("new", 1), ("new", 2)):
            r = run_row({"path": path, "tokenizer": tokenizer, "workers": workers,
                         "corpus": corpus, "tmp": tmp})  # fmt: skip
            r["rate"] = r["tokens"] / r["seconds"]
            rows[tokenizer, path, workers] = r
            ratio = r["rate"] / rows[tokenizer, "today", 0]["rate"]
            print(f"| {tokenizer} | {path} | {workers or '-'} | {r['tokens']:,} | "
                  f"{r['seconds']:.1f} | {r['rate'] / 1e6:.2f} | {ratio:.2f} | "
                  f"{r['main_cpu']:.1f} + {r['worker_cpu']:.1f} | "
                  f"{r['peak_rss'] / 2**20:,.0f} |", flush=True)  # fmt: skip
    sampler = max(r["sampler_cpu"] for r in rows.values())
    print(f"\n(the RSS sampler thread, not counted above, took at most {sampler:.1f} CPU s a row)")
    for tokenizer in ("gpt2", "byte"):
        today, one_, two = (rows[tokenizer, p, w] for p, w in (("today", 0), ("new", 1),
                                                               ("new", 2)))  # fmt: skip
        print(f"{tokenizer}: wall clock: 2 workers = {two['rate'] / today['rate']:.2f}x today, "
              f"1 -> 2 workers = {two['rate'] / one_['rate']:.2f}x. Per CPU-second: today "
              f"{today['tokens'] / today['main_cpu'] / 1e6:.2f}M tokens, a worker "
              f"{two['tokens'] / two['worker_cpu'] / 1e6:.2f}M, the main process feeds "
              f"{two['tokens'] / two['main_cpu'] / 1e6:.2f}M")  # fmt: skip
        cores = min(len(os.sched_getaffinity(0)), 3)  # main + 2 workers
        bound = today["main_cpu"] / ((two["main_cpu"] + two["worker_cpu"]) / cores)
        print(f"{tokenizer}: CPU-bound ceiling with 2 workers on {cores} cores, from the CPU "
              f"seconds (what a quiet machine can reach): {bound:.2f}x today")  # fmt: skip


def memory(corpora: dict[float, str], tmp: str) -> None:
    print(f"\nMemory, GPT-2 BPE, 2 workers, {' and '.join(f'{mb:g} MB' for mb in corpora)}\n")
    print("| corpus MB | tokens | seconds | M tokens/s | CPU s main + workers | peak RSS MiB "
          "(main + workers) |\n|---|---|---|---|---|---|")  # fmt: skip
    rows = []
    for mb, corpus in corpora.items():
        r = run_row({"path": "new", "tokenizer": "gpt2", "workers": 2, "corpus": corpus,
                     "tmp": tmp})  # fmt: skip
        rows.append(r)
        print(f"| {mb:g} | {r['tokens']:,} | {r['seconds']:.1f} | "
              f"{r['tokens'] / r['seconds'] / 1e6:.2f} | {r['main_cpu']:.1f} + "
              f"{r['worker_cpu']:.1f} | {r['peak_rss'] / 2**20:,.0f} |", flush=True)  # fmt: skip
    small, large = rows
    tokens = large["tokens"] - small["tokens"]  # marginal rates: start-up costs cancel out
    per_worker = tokens / (large["worker_cpu"] - small["worker_cpu"])
    feed = tokens / max(large["main_cpu"] - small["main_cpu"], 1e-9)
    node = min(63 * per_worker, feed)
    print(f"\nGPT-2, marginal CPU time between the two corpora: {per_worker / 1e6:.2f}M tokens "
          f"per worker CPU-second; the main process feeds {feed / 1e6:.1f}M per CPU-second. "
          f"A 64-core node (63 workers) at min(63 x worker, main) = {node / 1e6:.1f}M "
          f"tokens/s would prepare the 5.6B trial's {LADDER_TOKENS / 1e9:.0f}B tokens in "
          f"~{LADDER_TOKENS / node / 3600:.1f} h (CPU seconds are inflated on a loaded machine, "
          "whose other jobs share the cores; the estimate assumes the source is read as fast)")  # fmt: skip


if __name__ == "__main__":
    main()
