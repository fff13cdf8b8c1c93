"""Buffers that reads fill: payloads as ``bytes`` without a second copy, and uninitialised
scratch.

Records read back carry ``bytes`` (straw-queue's type), and a payload is read straight
into its bytes object: CPython's ``PyBytes_FromStringAndSize(NULL, n)`` makes an
uninitialised bytes object that nothing else references yet, which is filled through a
view of its buffer before it is handed out (what C extensions do).  Elsewhere (another
Python) a bytearray is filled and copied once.

Large buffers ask for transparent huge pages, as NumPy does for its arrays (with THP in
"madvise" mode, the common default, a large payload otherwise takes a page fault per
page).
"""

from __future__ import annotations

import ctypes
import platform
from typing import Any

import numpy as np

PAGE = 4096  # the page: of memory (madvise), and of another client's partial view of a file

_CPYTHON = platform.python_implementation() == "CPython"
if _CPYTHON:
    _new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
    _new_bytes.restype = ctypes.py_object
    _new_bytes.argtypes = (ctypes.c_char_p, ctypes.c_ssize_t)
    _BYTES_DATA = bytes.__basicsize__ - 1  # offset of the data in a bytes object


_HUGE_MIN = 4 << 20
try:
    _libc: Any = ctypes.CDLL(None, use_errno=True)
    _madvise = _libc.madvise
    _madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
except (OSError, AttributeError):
    _madvise = None
_MADV_HUGEPAGE = 14  # Linux


def _advise_huge(addr: int, n: int) -> None:
    if _madvise is None or n < _HUGE_MIN:
        return
    start = -(-addr // PAGE) * PAGE  # madvise takes whole pages inside the buffer
    end = (addr + n) // PAGE * PAGE
    if end > start:
        _madvise(start, end - start, _MADV_HUGEPAGE)  # advice only: errors are ignored


def fresh_bytes(n: int) -> tuple[bytes, memoryview]:
    """A new ``bytes`` of ``n`` bytes and a writable view of its content: the caller fills
    the view completely before the bytes object is used (its content is uninitialised).
    Not on CPython: a bytearray (bytes-like: compares, decodes, slices the same)."""
    if _CPYTHON and n > 0:
        data = _new_bytes(None, n)
        addr = id(data) + _BYTES_DATA
        _advise_huge(addr, n)
        view = memoryview((ctypes.c_char * n).from_address(addr))
        return data, view.cast("B")
    if n == 0:
        return b"", memoryview(bytearray())
    buf = bytearray(n)
    return buf, memoryview(buf)  # type: ignore[return-value]


def alloc(size: int) -> memoryview:
    """An uninitialised byte buffer: a read fills it, so zero-filling would be wasted."""
    arr: Any = np.empty(size, dtype=np.uint8)
    return memoryview(arr).cast("B")
