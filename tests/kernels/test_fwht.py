import math

import pytest
import torch

from scalelab.kernels.hadamard import (
    hadamard_transform,
    hadamard_transform_affine,
    nearest_supported_sizes,
)
from scalelab.kernels.reference import dense_hadamard_matrix, dense_hadamard_transform

# One list per size family: Sylvester 2^k, 12 * 2^k, 20 * 2^k, 28 * 2^k.
FAMILIES = {
    "pow2": [1, 2, 16, 64, 256, 1024, 2048, 4096],
    "12": [12, 24, 96, 768, 1536],
    "20": [20, 40, 320, 2560],
    "28": [28, 56, 1792, 3584],
}
ALL_SIZES = [d for sizes in FAMILIES.values() for d in sizes]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(0)


@pytest.mark.parametrize("d", ALL_SIZES)
def test_matches_dense_reference_fp32(d, gen):
    x = torch.randn(6, d, generator=gen)
    y = hadamard_transform(x)
    assert y.dtype == torch.float32 and y.shape == x.shape
    assert _rel(y, dense_hadamard_transform(x.double())) < 1e-5


@pytest.mark.parametrize("d", [8192, 16384, 32768])
def test_large_sizes_follow_sylvester_recursion(d, gen):
    # x @ H_2n = [x1 H_n + x2 H_n, x1 H_n - x2 H_n]  (H_2n = [[H_n, H_n], [H_n, -H_n]])
    x = torch.randn(2, d, generator=gen, dtype=torch.float64)
    x1, x2 = x[:, : d // 2], x[:, d // 2 :]
    h1 = hadamard_transform(x1, scale=1.0)
    h2 = hadamard_transform(x2, scale=1.0)
    expected = torch.cat([h1 + h2, h1 - h2], dim=-1)
    assert _rel(hadamard_transform(x, scale=1.0), expected) < 1e-12
    assert _rel(hadamard_transform(x).norm(dim=-1), x.norm(dim=-1)) < 1e-12


@pytest.mark.parametrize("d", [12, 20, 28, 24, 40, 56, 1024, 768])
def test_unit_scale_gives_plus_minus_one_entries(d):
    h = hadamard_transform(torch.eye(d, dtype=torch.float64), scale=1.0)
    assert torch.equal(h.abs(), torch.ones(d, d, dtype=torch.float64))
    assert torch.equal(h, dense_hadamard_matrix(d, scale=1.0))


@pytest.mark.parametrize("d", [12, 20, 28, 64, 768, 1792, 2560])
def test_orthonormal_h_times_h_transpose_is_identity(d):
    h = hadamard_transform(torch.eye(d, dtype=torch.float64))  # rows of H / sqrt(d)
    assert torch.allclose(h.abs(), torch.full_like(h, 1 / math.sqrt(d)))
    assert torch.allclose(h @ h.T, torch.eye(d, dtype=torch.float64), atol=1e-12)


@pytest.mark.parametrize("d", [16, 12, 20, 28, 768, 2560, 32768])
def test_norm_is_preserved(d, gen):
    x = torch.randn(4, d, generator=gen)
    y = hadamard_transform(x)
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-5)


def test_leading_dims_and_non_contiguous_input(gen):
    x = torch.randn(3, 768, 5, generator=gen).transpose(1, 2)  # (3, 5, 768), strided
    y = hadamard_transform(x)
    assert y.shape == (3, 5, 768)
    assert _rel(y, dense_hadamard_transform(x.double())) < 1e-5


def test_empty_batch():
    x = torch.zeros(0, 3, 768, requires_grad=True)
    y = hadamard_transform(x)
    assert y.shape == (0, 3, 768)
    y.sum().backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize("d", [12, 20, 28, 48])
def test_backward_is_the_transposed_transform(d, gen):
    # Paley type I blocks (12, 20) are not symmetric: grad must be g @ H^T, not g @ H.
    x = torch.randn(5, d, generator=gen, dtype=torch.float64, requires_grad=True)
    g = torch.randn(5, d, generator=gen, dtype=torch.float64)
    hadamard_transform(x).backward(g)
    h = dense_hadamard_matrix(d)
    assert torch.allclose(x.grad, g @ h.T, atol=1e-12)


@pytest.mark.parametrize("d", [1, 2, 12, 16, 20, 28, 40, 64])
def test_gradcheck_float64(d, gen):
    x = torch.randn(3, d, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(hadamard_transform, (x,))
    assert torch.autograd.gradgradcheck(hadamard_transform, (x,))
    a = torch.randn(d, generator=gen, dtype=torch.float64, requires_grad=True)
    b = torch.randn(d, generator=gen, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(hadamard_transform_affine, (x, a, b))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("d", [1024, 768, 2560])
def test_half_precision_accumulates_in_fp32(dtype, d, gen):
    x = torch.randn(8, d, generator=gen).to(dtype)
    y = hadamard_transform(x)
    assert y.dtype == dtype
    exact = dense_hadamard_transform(x.double())  # same rounded inputs, exact sums
    # within one rounding of the output dtype: summing in bf16/fp16 would be far worse
    ulp = torch.finfo(dtype).eps
    assert ((y.double() - exact).abs() <= ulp * exact.abs() + 1e-6).all()


@pytest.mark.parametrize("d", [12, 768, 1024])
def test_affine_matches_reference_and_its_gradients(d, gen):
    x = torch.randn(4, 3, d, generator=gen, requires_grad=True)
    alpha = torch.randn(d, generator=gen, requires_grad=True)
    beta = torch.randn(d, generator=gen, requires_grad=True)
    g = torch.randn(4, 3, d, generator=gen)
    out = hadamard_transform_affine(x, alpha, beta)
    out.backward(g)
    grads = [t.grad.clone() for t in (x, alpha, beta)]
    for t in (x, alpha, beta):
        t.grad = None
    h = dense_hadamard_matrix(d).float()
    ref = alpha * (x @ h) + beta
    ref.backward(g)
    assert _rel(out, ref) < 1e-5
    for got, t in zip(grads, (x, alpha, beta), strict=True):
        assert _rel(got, t.grad) < 1e-5


def test_affine_keeps_input_dtype_with_fp32_parameters(gen):
    x = torch.randn(4, 256, generator=gen).to(torch.bfloat16).requires_grad_()
    alpha = torch.ones(256, requires_grad=True)
    beta = torch.zeros(256, requires_grad=True)
    out = hadamard_transform_affine(x, alpha, beta)
    assert out.dtype == torch.bfloat16
    out.float().sum().backward()
    assert x.grad.dtype == torch.bfloat16 and alpha.grad.dtype == torch.float32


@pytest.mark.parametrize("d", [1000, 3000, 100, 65536])
def test_unsupported_width_lists_nearest_sizes(d):
    with pytest.raises(ValueError, match=f"width {d}") as err:
        hadamard_transform(torch.zeros(2, d))
    near = nearest_supported_sizes(d)
    assert near and all(str(s) in str(err.value) for s in near)
    with pytest.raises(ValueError, match="nearest supported widths"):
        hadamard_transform_affine(torch.zeros(2, d), torch.ones(d), torch.zeros(d))


def test_rejects_integer_input_and_bad_affine_shapes():
    with pytest.raises(TypeError):
        hadamard_transform(torch.ones(2, 16, dtype=torch.int64))
    with pytest.raises(ValueError, match="shape"):
        hadamard_transform_affine(torch.ones(2, 16), torch.ones(8), torch.zeros(16))
