"""`--where`'s literals compared in their column's own type (query.py parses the syntax).

pyarrow, left to itself, casts: an int64 column against a float literal (`tokens >= 1e9`)
fails as soon as a value exceeds 2^24, a float column against an integer beyond 2^53 fails
too, a bool column against 0/1 has no kernel. Here the literal is turned into the column's
type without changing which rows match (Python's exact comparison of ints and floats):

- integer columns (and bool columns, as 0/1): `x OP v` becomes `x OP' b` with b an integer
  within the column's range (`n >= 16777216.5` is `n >= 16777217`; `n == 1.5` matches
  nothing; `n < 1e300` every row with a value);
- float columns: an integer a double cannot hold (2^53 + 1) is compared through the two
  doubles around it;
- text columns take strings only; numbers against text, or text against numbers, are a
  ResultsError naming the column.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .tables import ResultsError

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.compute as pc

# the comparisons true of every value above / below a bound
_UPWARD = ("greater", "greater_equal")
_DOWNWARD = ("less", "less_equal")


class Literals:
    """A column's comparisons with --where literals; this base class keeps the literal's
    Python type (no schema given, or a type with no rule here)."""

    def __init__(self, name: str, text: str, type_: pa.DataType | None = None) -> None:
        self.name, self.text, self.type = name, text, type_

    def compare(self, field: pc.Expression, func: str, value: Any) -> pc.Expression:
        import pyarrow.compute as pc

        if value is None:  # a null of the column's type: no row matches, as ever
            return getattr(pc, func)(self.cast(field), self.scalar(None))
        return self._compare(self.cast(field), func, self.checked(value))

    def isin(self, field: pc.Expression, values: list[Any]) -> pc.Expression:
        members = [self.member(self.checked(v)) if v is not None else None for v in values]
        return self.cast(field).isin(self.array([m for m in members if m is not _NONE]))

    # what each kind of column overrides
    def cast(self, field: pc.Expression) -> pc.Expression:
        return field

    def checked(self, value: Any) -> Any:
        return value

    def member(self, value: Any) -> Any:
        """The literal as a value of the column (_NONE: no value of the column equals it)."""
        return value

    def scalar(self, value: Any) -> pa.Scalar:
        import pyarrow as pa

        return pa.scalar(value) if self.type is None else pa.scalar(value, self.type)

    def array(self, values: list[Any]) -> pa.Array:
        import pyarrow as pa

        return pa.array(values) if self.type is None else pa.array(values, self.type)

    def _compare(self, field: pc.Expression, func: str, value: Any) -> pc.Expression:
        import pyarrow.compute as pc

        return getattr(pc, func)(field, self.scalar(value))


_NONE = object()


class _Text(Literals):
    def checked(self, value: Any) -> Any:
        if not isinstance(value, str):
            raise ResultsError(
                f"--where {self.text!r}: {self.name} holds text: compare it with a quoted "
                f"string, not {value!r}"
            )
        return value


class _Numbers(Literals):
    what = "numbers"

    def checked(self, value: Any) -> Any:
        if isinstance(value, str):
            raise ResultsError(
                f"--where {self.text!r}: {self.name} holds {self.what}, not text ({value!r})"
            )
        return value


class _Integers(_Numbers):
    """x OP v for integers x in [lo, hi]: as x OP' b with b an integer in [lo, hi]."""

    def __init__(self, name: str, text: str, type_: pa.DataType, lo: int, hi: int) -> None:
        super().__init__(name, text, type_)
        self.lo, self.hi = lo, hi

    def member(self, value: Any) -> Any:
        whole = isinstance(value, int) or (math.isfinite(value) and float(value).is_integer())
        return int(value) if whole and self.lo <= value <= self.hi else _NONE

    def _compare(self, field: pc.Expression, func: str, value: Any) -> pc.Expression:
        import pyarrow.compute as pc

        op, bound = self.bound(func, value)
        return getattr(pc, op)(field, self.scalar(bound))

    def bound(self, func: str, v: float) -> tuple[str, int]:
        lo, hi = self.lo, self.hi
        if v > hi:  # below it: every value; above it or equal: none
            return ("less_equal", hi) if func in (*_DOWNWARD, "not_equal") else ("greater", hi)
        if v < lo:
            return ("greater_equal", lo) if func in (*_UPWARD, "not_equal") else ("less", lo)
        floor, ceil = math.floor(v), math.ceil(v)
        if func in ("less", "greater_equal"):
            return func, ceil
        if func in ("less_equal", "greater"):
            return func, floor
        if floor == ceil:  # == / != a whole number
            return func, floor
        return ("greater_equal", lo) if func == "not_equal" else ("less", lo)


class _Bools(_Integers):
    """True/False and numbers both, as 0/1 (Python's True == 1)."""

    what = "True/False"

    def __init__(self, name: str, text: str) -> None:
        import pyarrow as pa

        super().__init__(name, text, pa.int64(), 0, 1)

    def cast(self, field: pc.Expression) -> pc.Expression:
        import pyarrow as pa

        return field.cast(pa.int64())


class _Floats(_Numbers):
    """Compared as doubles; an integer no double holds, through the two around it."""

    def __init__(self, name: str, text: str, type_: pa.DataType) -> None:
        import pyarrow as pa

        super().__init__(name, text, pa.float64())
        self.narrow = type_.bit_width < 64  # float16/32: widened first, exactly

    def cast(self, field: pc.Expression) -> pc.Expression:
        return field.cast(self.type) if self.narrow else field

    def member(self, value: Any) -> Any:
        return float(value) if _exact_double(value) else _NONE

    def _compare(self, field: pc.Expression, func: str, value: Any) -> pc.Expression:
        import pyarrow.compute as pc

        if _exact_double(value):
            return getattr(pc, func)(field, self.scalar(float(value)))
        lower = float(value)
        lower = lower if lower < value else math.nextafter(lower, -math.inf)
        upper = math.nextafter(lower, math.inf)
        if func in _DOWNWARD:
            return pc.less_equal(field, self.scalar(lower))
        if func in _UPWARD:
            return pc.greater_equal(field, self.scalar(upper))
        # no double equals it: == is false, != true, on every row with a value
        op = getattr(pc, func)
        join = pc.and_kleene if func == "equal" else pc.or_kleene
        return join(op(field, self.scalar(lower)), op(field, self.scalar(upper)))


def _exact_double(value: Any) -> bool:
    """A float, or an integer that a double holds exactly."""
    return not isinstance(value, int) or int(float(value)) == value


def typed(type_: pa.DataType | None, name: str, text: str) -> Literals:
    """How column `name` of `type_` (None: not known) compares with literals."""
    import pyarrow as pa

    if type_ is not None and pa.types.is_dictionary(type_):
        type_ = type_.value_type
    if type_ is None:
        return Literals(name, text)
    if pa.types.is_boolean(type_):
        return _Bools(name, text)
    if pa.types.is_integer(type_):
        bits, signed = type_.bit_width, pa.types.is_signed_integer(type_)
        lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
        return _Integers(name, text, type_, lo, hi)
    if pa.types.is_floating(type_):
        return _Floats(name, text, type_)
    if pa.types.is_string(type_) or pa.types.is_large_string(type_):
        return _Text(name, text, type_)
    return Literals(name, text)  # dates, lists, ...: pyarrow's own casts
