"""Extract benchmarks/data/pythia_ladder.csv from a clone of EleutherAI/pythia (the
zero-shot evaluations in evals/pythia-v1/pythia-<size>/zero-shot/<size>_step<S>.json):
one row per size and checkpoint from step 1000 on, its parameters (counted from the
architecture table of the repository's README), tokens (S x 2,097,152) and the tasks'
accuracies, standard errors and lambada's perplexity of the correct word.

Run: python benchmarks/pythia_ladder.py PATH_TO_PYTHIA_GIT [OUT.csv]
(PATH may be a bare repository: the files are read with `git show HEAD:...`.)
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

# size: (layers, d_model), README's table; vocabulary 50,304, untied input and output
# (pythia-1b has no zero-shot evaluations of the standard run in evals/pythia-v1: left out)
ARCH = {"70m": (6, 512), "160m": (12, 768), "410m": (24, 1024), "1.4b": (24, 2048), "2.8b": (32, 2560), "6.9b": (32, 4096), "12b": (36, 5120)}  # fmt: skip
VOCAB = 50304
TOKENS_PER_STEP = 2_097_152
TASKS = ("arc_easy", "arc_challenge", "piqa", "sciq", "winogrande", "lambada_openai")
FIRST_STEP = 1000


def n_params(layers: int, d: int) -> int:
    """GPT-NeoX: per layer 12 d^2 weights and 13 d biases and norms; the final norm; the
    embedding and unembedding (70,426,624 for 70M, as Hugging Face counts it)."""
    return layers * (12 * d * d + 13 * d) + 2 * d + 2 * VOCAB * d


def main(repo: str, out: str = "benchmarks/data/pythia_ladder.csv") -> None:
    git = ["git", "--git-dir" if repo.endswith("repo") or repo.endswith(".git") else "-C", repo]
    names = subprocess.run([*git, "ls-tree", "-r", "--name-only", "HEAD", "evals/pythia-v1"],
                           check=True, capture_output=True, text=True).stdout.split()  # fmt: skip
    rows = []
    for size, (layers, d) in ARCH.items():
        prefix = f"evals/pythia-v1/pythia-{size}/zero-shot/{size}_step"
        for name in names:
            if not name.startswith(prefix) or int(name[len(prefix) : -5]) < FIRST_STEP:
                continue
            step = int(name[len(prefix) : -5])
            shown = subprocess.run([*git, "show", f"HEAD:{name}"], check=True,
                                   capture_output=True, text=True).stdout  # fmt: skip
            results = json.loads(shown)["results"]
            row = {"size": size.upper(), "step": step, "n_params": n_params(layers, d),
                   "tokens": step * TOKENS_PER_STEP}  # fmt: skip
            for task in TASKS:
                r = results[task]
                row[f"eval_{task}_acc"] = r["acc"]
                row[f"eval_{task}_acc_stderr"] = r["acc_stderr"]
            row["eval_lambada_openai_perplexity"] = results["lambada_openai"]["ppl"]
            rows.append(row)
    rows.sort(key=lambda r: (r["n_params"], r["step"]))
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"{len(rows)} rows -> {Path(out)}")


if __name__ == "__main__":
    main(*sys.argv[1:])
