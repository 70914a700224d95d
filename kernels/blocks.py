"""Small dense Hadamard blocks: Sylvester 2^k and the Paley orders 12, 20, 28.

These are the building blocks of the fast transform (kernels/hadamard.py, kernels/triton_fwht.py)
and of the dense test reference (kernels/reference.py). Entries are +-1 (unnormalised):
H @ H.T == order * I. Paley type I blocks are not symmetric, so callers must use H.T for the
transposed (backward) transform.
"""

from __future__ import annotations

from functools import cache

import numpy as np

from scalelab.kernels.sizes import hadamard_factors


def _quadratic_character(q: int) -> np.ndarray:
    """chi(a) for a in GF(q), q an odd prime: 0 at 0, +1 on squares, -1 elsewhere."""
    chi = -np.ones(q, dtype=np.int64)
    chi[0] = 0
    chi[[(x * x) % q for x in range(1, q)]] = 1
    return chi


def _jacobsthal(q: int) -> np.ndarray:
    """Q[a, b] = chi(a - b) over GF(q)."""
    a = np.arange(q)
    return _quadratic_character(q)[(a[:, None] - a[None, :]) % q]


def paley_type_one(q: int) -> np.ndarray:
    """Order q + 1, q prime with q = 3 mod 4: H = I + S, S = [[0, 1^T], [-1, Q]] skew."""
    assert q % 4 == 3
    s = np.zeros((q + 1, q + 1), dtype=np.int64)
    s[0, 1:] = 1
    s[1:, 0] = -1
    s[1:, 1:] = _jacobsthal(q)
    return np.eye(q + 1, dtype=np.int64) + s


def paley_type_two(q: int) -> np.ndarray:
    """Order 2(q + 1), q prime with q = 1 mod 4, from the symmetric conference matrix
    C = [[0, 1^T], [1, Q]]: H = C (x) [[1, 1], [1, -1]] + I (x) [[1, -1], [-1, -1]]."""
    assert q % 4 == 1
    c = np.zeros((q + 1, q + 1), dtype=np.int64)
    c[0, 1:] = 1
    c[1:, 0] = 1
    c[1:, 1:] = _jacobsthal(q)
    plus = np.array([[1, 1], [1, -1]])
    zero = np.array([[1, -1], [-1, -1]])
    return np.kron(c, plus) + np.kron(np.eye(q + 1, dtype=np.int64), zero)


def sylvester(order: int) -> np.ndarray:
    """H_2n = [[H_n, H_n], [H_n, -H_n]] from H_1 = [1] (what scipy.linalg.hadamard builds;
    numpy alone, so the models import on a GPU image without scipy)."""
    if order < 1 or order & (order - 1):
        raise ValueError(f"a Sylvester Hadamard block's order is a power of two, got {order}")
    h = np.ones((1, 1), dtype=np.int64)
    while h.shape[0] < order:
        h = np.block([[h, h], [h, -h]])
    return h


@cache
def hadamard_block(order: int) -> np.ndarray:
    """The unnormalised order-``order`` block used here (read-only int array)."""
    if order == 12:
        h = paley_type_one(11)
    elif order == 20:
        h = paley_type_one(19)
    elif order == 28:
        h = paley_type_two(13)
    else:
        h = sylvester(order)
    h.setflags(write=False)
    return h


def dense_hadamard(d: int) -> np.ndarray:
    """Unnormalised H_d = H_m (x) H_n, d = m * n (the d x d matrix; reference use only)."""
    m, n = hadamard_factors(d)
    return np.kron(hadamard_block(m).astype(np.float64), hadamard_block(n).astype(np.float64))
