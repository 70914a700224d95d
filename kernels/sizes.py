"""Widths that have an exact Hadamard transform here (torch-free, so configs can import it).

A width d is supported when d = m * 2^k with m in {1, 12, 20, 28} and d <= MAX_WIDTH:
H_d = H_m (Kronecker) H_{2^k}, with H_m a Paley block (kernels/blocks.py) and H_{2^k}
Sylvester's. Nothing is padded and truncated: every supported transform is orthogonal.
"""

from __future__ import annotations

MAX_WIDTH = 32768
# Orders of the non-power-of-two Hadamard blocks built in kernels/blocks.py.
PALEY_ORDERS = (12, 20, 28)


def _split(d: int) -> tuple[int, int] | None:
    """(m, 2^k) with d = m * 2^k and m in {1, 12, 20, 28}, or None."""
    if d < 1 or d > MAX_WIDTH:
        return None
    for m in (1, *PALEY_ORDERS):
        if d % m == 0:
            n = d // m
            if n & (n - 1) == 0:
                return m, n
    return None


def supported_hadamard_size(d: int) -> bool:
    """True when a width-d orthonormal Hadamard transform exists here."""
    return isinstance(d, int) and not isinstance(d, bool) and _split(d) is not None


def hadamard_factors(d: int) -> tuple[int, int]:
    """(m, n): d = m * n, m the Paley order (1 for a pure power of two), n a power of two."""
    split = _split(d)
    if split is None:
        raise ValueError(unsupported_message(d))
    return split


def all_supported_sizes() -> list[int]:
    sizes = set()
    for m in (1, *PALEY_ORDERS):
        n = 1
        while m * n <= MAX_WIDTH:
            sizes.add(m * n)
            n *= 2
    return sorted(sizes)


def nearest_supported_sizes(d: int, count: int = 2) -> list[int]:
    """The supported widths closest to d: the largest below and the smallest above
    (``count`` of each side at most), ascending."""
    sizes = all_supported_sizes()
    below = [s for s in sizes if s < d][-count:]
    above = [s for s in sizes if s > d][:count]
    return below + above


def unsupported_message(d: int) -> str:
    near = ", ".join(str(s) for s in nearest_supported_sizes(d))
    return (
        f"no Hadamard transform of width {d}: supported widths are 2^k or m*2^k with "
        f"m in {{12, 20, 28}}, up to {MAX_WIDTH}; nearest supported widths: {near}"
    )
