import subprocess
import sys

import numpy as np
import pytest

from scalelab.kernels.blocks import dense_hadamard, hadamard_block, paley_type_one, paley_type_two
from scalelab.kernels.sizes import (
    MAX_WIDTH,
    all_supported_sizes,
    nearest_supported_sizes,
    supported_hadamard_size,
)

# Written out independently of kernels.sizes: every m * 2^k up to MAX_WIDTH.
_EXPECTED = {m * 2**k for m in (1, 12, 20, 28) for k in range(16) if m * 2**k <= MAX_WIDTH}


def _is_m_times_power_of_two(d: int) -> bool:
    return d in _EXPECTED


def test_sizes_module_does_not_import_torch():
    code = "import sys, scalelab.kernels.sizes; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("d", [1, 2, 64, 768, 1024, 1536, 1792, 2560, 5120, 12288, 32768])
def test_preset_widths_are_supported(d):
    assert supported_hadamard_size(d)


@pytest.mark.parametrize("d", [0, -8, 3, 1000, 3000, 65536, 12 * 4096, 36, 44, 2.0, True])
def test_other_widths_are_not(d):
    assert not supported_hadamard_size(d)


def test_supported_set_is_exactly_m_times_powers_of_two():
    expected = [d for d in range(1, MAX_WIDTH + 1) if _is_m_times_power_of_two(d)]
    assert all_supported_sizes() == expected
    assert all(supported_hadamard_size(d) for d in expected)


@pytest.mark.parametrize("d", [1000, 3000, 6000, 100, 40000])
def test_nearest_sizes_bracket_the_width(d):
    near = nearest_supported_sizes(d)
    assert all(supported_hadamard_size(s) for s in near)
    below = [s for s in near if s < d]
    above = [s for s in near if s > d]
    supported = [s for s in range(1, MAX_WIDTH + 1) if _is_m_times_power_of_two(s)]
    if below:  # the closest supported width below d is listed
        assert max(below) == max(s for s in supported if s < d)
    if d < MAX_WIDTH:
        assert min(above) == min(s for s in supported if s > d)


@pytest.mark.parametrize("order", [1, 2, 4, 8, 12, 16, 20, 28, 64])
def test_blocks_are_hadamard(order):
    h = hadamard_block(order)
    assert h.shape == (order, order)
    assert set(np.unique(h)) <= {-1, 1}
    np.testing.assert_array_equal(h @ h.T, order * np.eye(order))


def test_paley_constructions_for_other_primes():
    for q in (3, 7, 23, 31):
        h = paley_type_one(q)
        np.testing.assert_array_equal(h @ h.T, (q + 1) * np.eye(q + 1))
    for q in (5, 13, 17):
        h = paley_type_two(q)
        np.testing.assert_array_equal(h @ h.T, 2 * (q + 1) * np.eye(2 * (q + 1)))


def test_paley_type_one_block_is_not_symmetric():
    # the reason the backward pass must use H^T, not H
    h = hadamard_block(12)
    assert not np.array_equal(h, h.T)


@pytest.mark.parametrize("d", [24, 40, 56, 96, 768])
def test_kronecker_products_are_hadamard(d):
    h = dense_hadamard(d)
    np.testing.assert_array_equal(h @ h.T, d * np.eye(d))
