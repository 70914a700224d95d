"""The kernel choice (kernels/backend.py) without a GPU: a CPU tensor is made to claim the
Triton path (`triton_eligible`), and the Triton call is forced to fail to compile or to give
wrong numbers (the faults a CPU cannot produce for real); the kernel itself is checked in
Triton's interpreter (test_triton_interpreter.py) and on CUDA (test_triton_gpu.py)."""

import pytest
import torch

from scalelab.kernels import backend
from scalelab.kernels.backend import HadamardBackendWarning
from scalelab.kernels.hadamard import hadamard_transform, hadamard_transform_affine
from scalelab.kernels.reference import dense_hadamard_matrix
from scalelab.kernels.torch_fwht import torch_fwht
from scalelab.models.build import build
from scalelab.models.config import ModelConfig

D = 64


@pytest.fixture(autouse=True)
def fresh_choices():
    backend.forget()
    yield
    backend.forget()


@pytest.fixture
def triton_claimed(monkeypatch):
    """Every tensor claims the Triton path; returns the list of Triton calls made."""
    monkeypatch.setattr(backend, "triton_eligible", lambda x: True)
    return []


def _triton_fails(monkeypatch, calls, fault):
    def kernel(x, scale, transpose=False, **affine):
        calls.append(x.shape)
        if fault == "compile":
            raise RuntimeError("PassManager::run failed (forced compile failure)")
        y = torch_fwht(x, scale, transpose, **affine)
        return y * 1.5 if fault == "numbers" else y

    monkeypatch.setattr(backend, "run_triton", kernel)  # (importing triton takes seconds)


def _affine_and_grads(back: str):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, D, generator=gen, requires_grad=True)
    alpha = torch.randn(D, generator=gen, requires_grad=True)
    beta = torch.randn(D, generator=gen, requires_grad=True)
    out = hadamard_transform_affine(x, alpha, beta, backend=back)
    out.square().sum().backward()
    ref = alpha.detach() * (x.detach() @ dense_hadamard_matrix(D).float()) + beta.detach()
    return out.detach(), ref, x.grad


@pytest.mark.parametrize("fault", ["compile", "numbers"])
def test_auto_falls_back_to_torch_loudly_when_triton_fails(fault, triton_claimed, monkeypatch):
    _triton_fails(monkeypatch, triton_claimed, fault)
    with pytest.warns(HadamardBackendWarning, match="falling back to the torch path") as warned:
        out, ref, grad = _affine_and_grads("auto")
    assert torch.allclose(out, ref, atol=1e-5)  # the torch path's numbers, not the faulty ones
    assert grad is not None and torch.isfinite(grad).all()
    why = "forced compile failure" if fault == "compile" else "self-check"
    assert all(why in str(w.message) for w in warned)
    ((label, use),) = backend.used().items()
    assert label == f"{D} float32 cpu" and use.backend == "torch" and why in use.fallback
    # checked once per kind of call (forward, input and alpha gradients): later calls trust it
    tried = len(triton_claimed)
    _affine_and_grads("auto")
    assert len(triton_claimed) == tried == 3


@pytest.mark.parametrize("fault", ["compile", "numbers"])
def test_explicit_triton_raises_instead_of_falling_back(fault, triton_claimed, monkeypatch):
    _triton_fails(monkeypatch, triton_claimed, fault)
    with pytest.raises(RuntimeError, match="backend 'triton'.*torch path"):
        hadamard_transform(torch.randn(4, D), backend="triton")


def test_auto_runs_triton_after_its_self_check_passes(triton_claimed, monkeypatch):
    _triton_fails(monkeypatch, triton_claimed, None)  # a correct "kernel"
    out, ref, _ = _affine_and_grads("auto")
    assert torch.allclose(out, ref, atol=1e-5)
    assert len(triton_claimed) == 6  # a probe, then the call itself, per kind of call
    assert {u.backend for u in backend.used().values()} == {"triton"}


def test_backend_torch_is_honoured_by_the_model(triton_claimed, monkeypatch):
    _triton_fails(monkeypatch, triton_claimed, "compile")

    def model(back):
        return build(ModelConfig(size="nano", vocab_size=64, block_size=16,
                                 hadamard={"backend": back}))  # fmt: skip

    idx = torch.randint(0, 64, (2, 16))
    model("torch")(idx, idx).loss.backward()
    assert triton_claimed == []  # never tried
    assert {(u.backend, u.fallback) for u in backend.used().values()} == {("torch", "")}
    with pytest.warns(HadamardBackendWarning):
        model("auto")(idx, idx).loss.backward()  # the same model on auto does try (and fall back)
    assert triton_claimed


def test_cpu_tensors_do_not_claim_triton_and_bad_backends_are_refused():
    assert not backend.triton_eligible(torch.zeros(2, D))
    hadamard_transform(torch.randn(2, D))
    assert {(u.backend, u.fallback) for u in backend.used().values()} == {("torch", "")}
    with pytest.raises(ValueError, match="one of"):
        hadamard_transform(torch.randn(2, D), backend="cuda")
