# ruff: noqa: ANN001  (Triton reads parameter annotations: only constexpr ones are marked)
"""Triton kernel for the Hadamard transform, one pass over memory, affine epilogue fused.

Each program loads ROWS rows of width d into registers as fp32 (masked up to D, the next
power of two of the padded width), optionally scales them by a per-column vector (the
backward of the affine: H^T (alpha * g)), and applies up to three stages. A stage is a
``tl.dot`` of the row tensor's last axis with a small +-1 block (order 16..64, tensor cores),
followed by a rotation that moves that axis to the front; after all stages the axes are back
in order. The first block is H_m (x) H_{2^j} zero-padded to a power of two: the real entries
of a row are a prefix of the padded index space, so padding lanes stay zero and are never
stored (the transform itself is exact, not padded-and-truncated). Then ``scale``, the
optional ``alpha * y + beta``, and one store in the output dtype.

fp32 inputs use IEEE-fp32 dots; bf16/fp16 inputs use 3xTF32 dots (about fp32 accuracy,
accumulated in fp32), far below their output rounding.

One compiled kernel per width, dtype, device and form: Triton compiles a kernel per
*specialisation* of its arguments (an integer equal to 1 or divisible by 16, a pointer
16-byte aligned or not), so the row count is left unspecialised and every tensor is passed
16-byte aligned. Then the probe of kernels/backend.py's one-time self-check compiles, and
checks, the very kernel that every later call of its kind runs -- a training batch of
8 x 1024 rows, one decoded token or a view into a flat parameter buffer alike
(docs/architecture.md, 'Hadamard kernels').
"""

from __future__ import annotations

from functools import cache

import torch
import triton
import triton.language as tl

from scalelab.kernels.blocks import hadamard_block
from scalelab.kernels.sizes import hadamard_factors

_MIN_BLOCK, _MAX_BLOCK = 16, 64  # tl.dot needs every dim >= 16


def _next_pow2(v: int) -> int:
    return 1 << (v - 1).bit_length()


@cache
def triton_plan(d: int) -> tuple[tuple[int, int, int], ...]:
    """Stages as (padded block order, real block order, Paley m), most significant first."""
    m, n = hadamard_factors(d)
    k = n.bit_length() - 1
    best = None
    for j in range(k + 1):
        real = m * 2**j
        padded = max(_MIN_BLOCK, _next_pow2(real))
        if padded > _MAX_BLOCK:
            break
        rest = k - j
        if 0 < rest < 4:
            continue
        parts = -(-rest // 6)
        bits = [rest // parts + (i < rest % parts) for i in range(parts)] if parts else []
        if any(b < 4 for b in bits):
            continue
        stages = ((padded, real, m), *((2**b, 2**b, 1) for b in bits))
        key = (len(stages), sum(s[0] for s in stages))
        if best is None or key < best[0]:
            best = (key, stages)
    assert best is not None and len(best[1]) <= 3, d
    return best[1]


@cache
def _stage_matrices(d: int, device: torch.device, transpose: bool) -> tuple[torch.Tensor, ...]:
    mats = []
    for padded, real, m in triton_plan(d):
        h = torch.kron(
            torch.tensor(hadamard_block(m), dtype=torch.float32),
            torch.tensor(hadamard_block(real // m), dtype=torch.float32),
        )
        g = torch.zeros(padded, padded, dtype=torch.float32)
        g[:real, :real] = h.T if transpose else h
        mats.append(g.to(device))
    return tuple(mats)


@triton.jit
def _stage(x, g_ptr, ROWS: tl.constexpr, D: tl.constexpr, G: tl.constexpr, PREC: tl.constexpr):
    """x (ROWS, D): apply the G x G block to the last axis of x viewed as (..., G), then
    rotate that axis to the front: (ROWS, D/G, G) -> (ROWS, G, D/G)."""
    i = tl.arange(0, G)
    g = tl.load(g_ptr + i[:, None] * G + i[None, :])
    y = tl.dot(tl.reshape(x, (ROWS * (D // G), G)), g, input_precision=PREC)
    y = tl.permute(tl.reshape(y, (ROWS, D // G, G)), (0, 2, 1))
    return tl.reshape(y, (ROWS, D))


@triton.jit(do_not_specialize=["n_rows"])
def _fwht_kernel(
    x_ptr,
    out_ptr,
    pre_ptr,
    alpha_ptr,
    beta_ptr,
    g1_ptr,
    g2_ptr,
    g3_ptr,
    n_rows,
    d,
    scale,
    ROWS: tl.constexpr,
    D: tl.constexpr,
    G1: tl.constexpr,
    G2: tl.constexpr,
    G3: tl.constexpr,
    HAS_PRE: tl.constexpr,
    HAS_AFFINE: tl.constexpr,
    PREC: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, D)
    col_ok = cols < d
    mask = (rows[:, None] < n_rows) & col_ok[None, :]
    offs = rows[:, None].to(tl.int64) * d + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_PRE:
        x = x * tl.load(pre_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)[None, :]
    # Stages from the least significant axis; each rotation brings the next one last.
    if G3 > 1:
        x = _stage(x, g3_ptr, ROWS, D, G3, PREC)
    if G2 > 1:
        x = _stage(x, g2_ptr, ROWS, D, G2, PREC)
    x = _stage(x, g1_ptr, ROWS, D, G1, PREC) * scale
    if HAS_AFFINE:
        alpha = tl.load(alpha_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        beta = tl.load(beta_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        x = x * alpha[None, :] + beta[None, :]
    tl.store(out_ptr + offs, x.to(out_ptr.dtype.element_ty), mask=mask)


def _contiguous_aligned(t: torch.Tensor) -> torch.Tensor:
    """t contiguous, copied where its data is not 16-byte aligned (a view at an odd offset,
    e.g. into a flat parameter buffer): for such a pointer Triton would compile a second
    kernel, with narrower loads, that the self-check never ran. Fresh tensors are aligned."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def launch_config(d: int) -> tuple[int, int, int]:
    """(ROWS, D, num_warps): about 4-8K elements per program for small widths."""
    D = 1
    for padded, _, _ in triton_plan(d):
        D *= padded
    rows = max(1, 4096 // D)
    tile = rows * D
    num_warps = 4 if tile <= 4096 else 8 if tile <= 16384 else 16
    return rows, D, num_warps


def triton_fwht(
    x: torch.Tensor,
    scale: float,
    transpose: bool = False,
    *,
    pre: torch.Tensor | None = None,
    alpha: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
) -> torch.Tensor:
    """[alpha *] (scale * (pre * x) @ H_d[^T]) [+ beta] over the last dim, in x's dtype.

    No autograd here (kernels/hadamard.py wraps it). Under TRITON_INTERPRET=1 it also runs
    on CPU tensors, which is how the tests check it without a GPU.
    """
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise TypeError(f"triton_fwht supports fp32/bf16/fp16, got {x.dtype}")
    d = x.shape[-1]
    plan = triton_plan(d)
    mats = _stage_matrices(d, x.device, transpose)
    g1, g2, g3 = (*mats, mats[0], mats[0])[:3]  # unused pointers are never read
    sizes = (*(p for p, _, _ in plan), 1, 1)[:3]
    x2 = _contiguous_aligned(x.reshape(-1, d))
    out = torch.empty_like(x2)
    n_rows = x2.shape[0]
    if n_rows == 0:
        return out.reshape(x.shape)
    rows, D, num_warps = launch_config(d)
    dummy = x2
    pre, alpha, beta = (
        _contiguous_aligned(t) if t is not None else None for t in (pre, alpha, beta)
    )
    _fwht_kernel[(triton.cdiv(n_rows, rows),)](
        x2,
        out,
        pre if pre is not None else dummy,
        alpha if alpha is not None else dummy,
        beta if beta is not None else dummy,
        g1,
        g2,
        g3,
        n_rows,
        d,
        float(scale),
        ROWS=rows,
        D=D,
        G1=sizes[0],
        G2=sizes[1],
        G3=sizes[2],
        HAS_PRE=pre is not None,
        HAS_AFFINE=alpha is not None,
        PREC="ieee" if x.dtype == torch.float32 else "tf32x3",
        num_warps=num_warps,
    )
    return out.reshape(x.shape)
