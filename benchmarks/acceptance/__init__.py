"""The acceptance check behind scripts/gpu-acceptance.sh (issue 13): every check has a goal
and ends `pass`, `fail` or `skipped` (with why); one JSON and one Markdown summary.

    scripts/gpu-acceptance.sh [--cpu] [--out DIR]     # python -m benchmarks.acceptance

Without `--cpu` a CUDA device is required and each check runs at the issue's sizes (bf16,
124M and 1.3B, one GPU). `--cpu` runs the same code at nano sizes on the CPU (CI runs it,
so the script cannot rot); a goal that only means something on a GPU (MFU, CUDA peak
memory) is reported `skipped` with the reason, beside what the CPU could measure. Numbers
come only from what ran here; nothing is filled in for a GPU not present.

The checks (docs/benchmarks.md, "GPU acceptance", lists their goals):
- loss.py: 50-step bf16 vs fp32 loss curves of the training job;
- blocks.py: Hadamard vs dense attention blocks in bf16, error and time;
- training.py: the sweeps' 124M and 1.3B steps against the planner (model states, peak
  memory, MFU) and the checkpoint round trip;
- inference.py: TSA and BudgetFormer cached decoding against the masked full forward;
- gpu_tests.py: `pytest -m gpu` (CUDA and the Triton FWHT against a device copy).
"""
