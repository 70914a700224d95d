"""The GPU acceptance run behind scripts/gpu-acceptance.sh: every check has a goal and ends
`pass`, `fail` or `skipped` (with why); one JSON and one Markdown summary, rewritten as each
part ends.

    scripts/gpu-kit.sh                                  # where the package index is reachable
    scripts/gpu-acceptance.sh [--cpu] [--out DIR] [--only P,..] [--skip P,..] [--list]

Without `--cpu` a CUDA device is required and each part runs at the ladder's sizes (bf16,
one GPU). `--cpu` runs the same code at nano sizes on the CPU (CI runs it, offline, on a
Python that holds only torch and a GPU image's usual packages plus the kit), where a goal
that only means something on a GPU is `skipped` with "not measured: no GPU" beside what the
CPU could measure. Numbers come only from what ran here.

parts.py lists the parts in the order they run (the most valuable first) with their time
budgets; part.py runs one in a process of its own; kit.py installs the wheel kit;
docs/benchmarks.md ("GPU acceptance") lists every row with its goal.
"""
