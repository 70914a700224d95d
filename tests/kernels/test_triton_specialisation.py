"""The Triton kernel that kernels/backend.py's self-check compiles is the one that every
later call of its kind runs. Triton compiles one kernel per *specialisation* of the launch
arguments (an integer equal to 1 or divisible by 16, a pointer 16-byte aligned or not); here
Triton's own launcher code computes it from the arguments of the self-check's probe and of
the call, on CPU tensors (the launch itself, which needs a GPU, is where the stand-in stops).
"""

import math
from dataclasses import dataclass

import pytest
import torch

from scalelab.kernels import backend

triton_fwht = pytest.importorskip("scalelab.kernels.triton_fwht")  # imports triton: seconds
from triton.backends.nvidia.compiler import CUDABackend  # noqa: E402
from triton.runtime.jit import create_function_from_signature  # noqa: E402

D = 768  # the 124M width: a Paley-12 block, as the ladder's first rung


@dataclass(frozen=True)
class Call:
    shape: tuple[int, ...]
    dtype: torch.dtype = torch.bfloat16
    form: str = "plain"  # plain, affine (the forward), pre (the affine's input gradient)
    offset: int = 0  # elements between the start of the data's buffer and the tensors

    def tensors(self) -> tuple[torch.Tensor, dict[str, torch.Tensor | None]]:
        """x and its affine vectors, each `offset` elements into a buffer of its own (a view
        into a flat parameter buffer, say): not 16-byte aligned when offset > 0."""
        n, d = math.prod(self.shape), self.shape[-1]
        x = torch.randn(self.offset + n).to(self.dtype)[self.offset :].view(self.shape)
        alpha, beta = torch.randn(self.offset + 2 * d)[self.offset :].view(2, d)
        affine = {"pre": None, "alpha": None, "beta": None}
        if self.form == "affine":
            affine.update(alpha=alpha, beta=beta)
        elif self.form == "pre":
            affine.update(pre=alpha)
        return x, affine


CALLS = {
    "training batch 8 x 1024 tokens": Call((8, 1024, D)),
    "training batch, affine forward": Call((8, 1024, D), form="affine"),
    "training batch, affine input gradient": Call((8, 1024, D), form="pre"),
    "one decoded token": Call((1, 1, D)),
    "fp32, 2 x 19 tokens": Call((2, 19, D), torch.float32),
    "views at an odd offset into one buffer": Call((4, 16, D), torch.float32, "affine", 1),
    "bf16 input at an odd offset": Call((64, D), offset=3),
}


@pytest.fixture
def launches(monkeypatch) -> list[dict[str, object]]:
    """Each launch's specialisation (argument name -> Triton's signature entry for it)."""
    kernel = triton_fwht._fwht_kernel
    bind = create_function_from_signature(kernel.signature, kernel.params, CUDABackend)
    names = [p.name for p in kernel.params]
    seen: list[dict[str, object]] = []

    class Launcher:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                _, specialisation, _ = bind(*args, **kwargs)
                seen.append(dict(zip(names, specialisation, strict=True)))

            return launch

    monkeypatch.setattr(triton_fwht, "_fwht_kernel", Launcher())
    monkeypatch.setattr(backend, "triton_eligible", lambda x: True)
    backend.forget()
    yield seen
    backend.forget()


# The stand-in launch computes nothing, so the self-check fails and `auto` falls back: what
# it launched is what matters here.
@pytest.mark.filterwarnings("ignore::scalelab.kernels.backend.HadamardBackendWarning")
@pytest.mark.parametrize("call", list(CALLS.values()), ids=list(CALLS))
def test_the_self_check_compiles_the_kernel_that_the_call_runs(call, launches):
    x, affine = call.tensors()
    transpose = call.form == "pre"
    scale = 1 / math.sqrt(x.shape[-1])
    backend.choose(x, scale, transpose, "auto", **affine)  # the one-time self-check
    assert len(launches) == 1
    backend.run_triton(x, scale, transpose, **affine)  # the call itself
    probe, the_call = launches
    assert probe == the_call
