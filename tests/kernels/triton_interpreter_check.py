"""Run by test_triton_interpreter.py in a subprocess with TRITON_INTERPRET=1 (triton decides
interpreter-or-compile when a kernel is defined, so the variable must be set before
kernels.triton_fwht is imported). Prints one JSON object: check name -> relative error of the
Triton path against the torch path on CPU tensors."""

import json
import os

import torch

from scalelab.kernels import backend
from scalelab.kernels.hadamard import hadamard_transform, hadamard_transform_affine

assert os.environ.get("TRITON_INTERPRET") == "1"
torch.manual_seed(0)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def grads(fn, backend, *inputs, g):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves, backend=backend)
    out.backward(g)
    return out.detach(), [t.grad for t in leaves]


results = {}
# rows chosen so that the last program is partly masked (launch_config's ROWS: 256 rows
# for d <= 16, 4 rows for d = 768/1024, 1 row for 4096)
for d, rows in [
    (2, 300),
    (12, 300),
    (16, 257),
    (24, 130),
    (256, 17),
    (768, 7),
    (1024, 9),
    (1792, 3),
    (2560, 3),
    (4096, 2),
    (32768, 1),
]:
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        if dtype != torch.float32 and d not in (24, 768, 1024):
            continue
        x = torch.randn(rows, d).to(dtype)
        g = torch.randn(rows, d).to(dtype)
        key = f"{d}/{str(dtype).split('.')[-1]}"
        y_tr, (gx_tr,) = grads(hadamard_transform, "triton", x, g=g)
        y_to, (gx_to,) = grads(hadamard_transform, "torch", x, g=g)
        results[f"forward {key}"] = rel(y_tr, y_to)
        results[f"backward {key}"] = rel(gx_tr, gx_to)
        results[f"dtype {key}"] = float(y_tr.dtype != dtype or gx_tr.dtype != dtype)
        if d in (12, 768, 1024, 2560):
            alpha = torch.randn(d)
            beta = torch.randn(d)
            o_tr, g_tr = grads(hadamard_transform_affine, "triton", x, alpha, beta, g=g)
            o_to, g_to = grads(hadamard_transform_affine, "torch", x, alpha, beta, g=g)
            results[f"affine forward {key}"] = rel(o_tr, o_to)
            for name, a, b in zip(("x", "alpha", "beta"), g_tr, g_to, strict=True):
                results[f"affine grad {name} {key}"] = rel(a, b)

# `auto` on CPU tensors made to claim the Triton path: the real kernel must pass its one-time
# self-check (kernels/backend.py) in every form and dtype, so nothing falls back.
backend.forget()
backend.triton_eligible = lambda x: True
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    x = torch.randn(7, 768).to(dtype).requires_grad_()
    alpha, beta = (torch.randn(768, requires_grad=True) for _ in range(2))
    hadamard_transform_affine(x, alpha, beta).float().sum().backward()
used = backend.used()
results["auto fallbacks"] = float(sum(bool(u.fallback) for u in used.values()))
results["auto on triton"] = float(sum(u.backend == "triton" for u in used.values()))
print(json.dumps(results))
