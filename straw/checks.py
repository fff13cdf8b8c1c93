"""Argument checks shared by the store, the coordinator, the queue types and the codec.

Errors are part of the interface (``straw.errors``): a bad argument raises ``TypeError``
(wrong type) or ``ValueError`` (right type, out of range) naming the argument, before
anything is written.  These helpers state the two rules every caller would otherwise
repeat:

* integers are range-checked against what straw stores them as (msgpack and the frame
  headers carry 64-bit integers), so a value past 64 bits is a ``ValueError`` naming the
  field, never an ``OverflowError`` from deep inside an encoder;
* a ``bool`` is refused where a count, an index or a position is expected
  (``TypeError``): ``True`` is an ``int`` to Python but never a meaningful count.  Only
  Python ``int`` is accepted (convert NumPy integers with ``int(x)``).
"""

from __future__ import annotations

import math
import reprlib

from .errors import NotAnInteger

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 60, 60


def short_repr(value: object) -> str:
    """A bounded repr for error messages about hostile values: never a RecursionError
    (a 10,000-deep dict), never a 4,300-digit limit error (a huge int)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"{'-' if value < 0 else ''}an int of {value.bit_length()} bits"
    try:
        return _REPR.repr(value)
    except Exception:  # a user object whose __repr__ fails
        return f"a {type(value).__name__}"


def _bound(value: int) -> str:
    """A readable bound: powers of two as such (2**63-1), small ones as digits."""
    for name, v in (("2**64-1", UINT64_MAX), ("2**63-1", INT64_MAX), ("-2**63", INT64_MIN)):
        if value == v:
            return name
    return str(value)


def check_int(where: str, value: object, lo: int = INT64_MIN, hi: int = INT64_MAX, *,
              type_error: type[TypeError] = TypeError) -> int:
    """``value`` as an int in ``lo..hi`` (inclusive); ``type_error`` (a ``TypeError``)
    for a non-int or a bool, ``ValueError`` out of range, both naming ``where``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise type_error(f"{where} must be an int, got {type(value).__name__} "
                        f"{short_repr(value)}"
                        + (" (a bool is not a count)" if isinstance(value, bool) else ""))
    if not lo <= value <= hi:
        raise ValueError(f"{where} must be a 64-bit int in {_bound(lo)}..{_bound(hi)}, got "
                         f"{short_repr(value)}")
    return value


def check_count(where: str, value: object, minimum: int = 0) -> int:
    """A count, size, offset or position: an int in ``minimum..2**63-1``."""
    return check_int(where, value, minimum, INT64_MAX)


def check_u64(where: str, value: object) -> int:
    """A usage amount (a record's tokens, a task's estimates): an int in 0..2**64-1, the
    unsigned range straw-queue accepts (msgpack stores it as it is).  Another type (a
    float, a bool, a str) is ``NotAnInteger``: a ``TypeError`` (ours) and a
    ``ValueError`` (straw-queue's "must be a nonnegative u64")."""
    return check_int(where, value, 0, UINT64_MAX, type_error=NotAnInteger)


def check_usage_total(where: str, total: int) -> int:
    """A sum of usage amounts that is stored or reported (a publication's tokens with its
    dependencies', a queue's usage): beyond 2**64-1 it is a ``ValueError`` saying
    "overflow" (straw-queue's word), never a wrapped or truncated value."""
    if total > UINT64_MAX:
        raise ValueError(f"{where} is {total}, an unsigned 64-bit accounting overflow "
                         "(the sum exceeds 2**64-1); use smaller token or byte counts")
    return total


def check_seconds(where: str, value: object, *, positive: bool) -> float:
    """A duration: a finite real number of seconds, > 0 (``positive``) or >= 0; a bool
    is refused (``TypeError``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{where} must be a number of seconds, got {type(value).__name__}")
    try:
        seconds = float(value)
    except OverflowError:  # an int beyond the range of a float
        seconds = math.inf
    if not math.isfinite(seconds) or seconds < 0 or (positive and seconds == 0):
        raise ValueError(f"{where} must be a finite number of seconds "
                         f"{'> 0' if positive else '>= 0'}, got {short_repr(value)}")
    return seconds


__all__ = ["INT64_MIN", "INT64_MAX", "UINT64_MAX", "check_int", "check_count", "check_u64",
           "check_usage_total",
           "check_seconds", "short_repr"]
