"""Widths that have an exact Hadamard transform here (torch-free, so configs can import it).

A width d is supported when d = m * 2^k with m in {1, 12, 20, 28} and d <= MAX_WIDTH:
H_d = H_m (Kronecker) H_{2^k}, with H_m a Paley block (kernels/blocks.py) and H_{2^k}
Sylvester's. Nothing is padded and truncated: every supported transform is orthogonal.
"""

from __future__ import annotations

from functools import cache

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


# Largest dense block of one torch stage. The transform is memory-bound on CPU: fewer, larger
# stages (fewer passes over memory) beat less arithmetic; 64 measured faster than 16 or 32
# for d = 1024..4096 (benchmarks/hadamard.py).
_MAX_BLOCK = 64


@cache
def torch_plan(d: int) -> tuple[tuple[int, int], ...]:
    """Stages as (block order, Paley order m or 1), most significant axis first.

    The first block is H_m (x) H_{2^j}; the rest are Sylvester blocks H_{2^b}. Chosen to
    minimise the number of stages, then the total block order (work per element).
    """
    m, n = hadamard_factors(d)
    k = n.bit_length() - 1
    best = None
    for j in range(k + 1):
        first = m * 2**j
        if first > _MAX_BLOCK and j > 0:
            break
        rest = k - j
        parts = -(-rest // (_MAX_BLOCK.bit_length() - 1))  # blocks of at most _MAX_BLOCK
        bits = [rest // parts + (i < rest % parts) for i in range(parts)] if parts else []
        stages = ([(first, m)] if first > 1 else []) + [(2**b, 1) for b in bits]
        key = (len(stages), sum(s for s, _ in stages))
        if best is None or key < best[0]:
            best = (key, tuple(stages))
    return best[1]


def transform_flops(d: int) -> int:
    """FLOPs per row of the staged transform as executed: each stage is a dense block of
    order b applied along one axis, 2 * d * b FLOPs (a multiply-add is 2)."""
    return 2 * d * sum(order for order, _ in torch_plan(d))
