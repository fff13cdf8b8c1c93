"""Checked reads of a tensor's payload: the buffer a load lands in (``allocate``, or the
caller's ``out``, ``out_view``) and ``ChunkReader``, which reads whole chunks in blocks and
verifies each chunk right after its block lands, on one thread or, for a large span, two.

Every read verifies every chunk it touches and nothing else.  The bytes go from the page
cache straight into the destination's memory (``readinto`` of ``_READ_BYTES`` blocks
through one descriptor), and each chunk is hashed right after its block lands, while it
is still in the CPU cache.  A span of ``_PARALLEL_LOAD`` bytes or more may be read by two
threads, each taking the next unread block and hashing it itself (``xxhash.xxh3_128``
releases the GIL; ``xxh3_128_digest`` does not): that pays on a free second core and costs
on a busy one, so ``_helpers`` (a ``_HelperPolicy``) decides it from present signals.  A
chunk that fails its checksum is read once more through a freshly looked-up descriptor,
and if it still fails is ``CorruptData`` at once (D6)."""

from __future__ import annotations

import math
import os
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import xxhash

from ..errors import CorruptData
from ..read.session import ReadSession
from .buffers import _buffers, _byte_view
from .frameworks import _can_pin, _is_torch_tensor, _np_dtype, _torch
from .threads import _Blocks, _executor, _HelperPolicy

_READ_BYTES = 1 << 20  # one read call covers this much (whole chunks), hashed chunk by chunk
_PARALLEL_LOAD = 8 << 20  # reads: a span of this much is read and verified by two threads


_helpers = _HelperPolicy()


def _use_helper(nbytes: int) -> bool | None:
    """Whether a span of ``nbytes`` gets a helper thread (``_helpers.choose``; tests
    replace this to force one way)."""
    return _helpers.choose(nbytes)


def _reset_after_fork() -> None:
    """In a forked child: a lock another thread held at the fork stays held.  The helper
    policy's estimates stay (the child runs on the same machine)."""
    _helpers.lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


def want_torch(framework: str | None) -> bool:
    """Whether a load returns torch: ``framework`` if given, else whenever torch is
    importable."""
    if framework not in (None, "torch", "numpy"):
        raise ValueError(f"framework must be None, 'torch' or 'numpy', got {framework!r}")
    if framework == "numpy":
        return False
    if framework == "torch":
        if _torch() is None:
            raise ImportError("framework='torch' needs torch, which is not importable")
        return True
    # straw-queue's load() returns torch, and its callers use the result as torch
    # (torch.equal, .to(device)): torch whenever it is importable
    return _torch() is not None


def allocate(dtype: str, itemsize: int, shape: tuple[int, ...], as_torch: bool,
             pin_memory: bool) -> tuple[Any, memoryview]:
    """An uninitialised tensor/array of ``dtype`` and ``shape`` and its flat byte view."""
    nbytes = math.prod(shape) * itemsize
    if as_torch:
        torch = _torch()
        tdtype = getattr(torch, dtype)
        if pin_memory and _can_pin(torch):
            raw = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            return raw.view(tdtype).reshape(shape), _byte_view(raw.numpy())
        if nbytes == 0:
            return torch.empty(shape, dtype=tdtype), memoryview(b"")
        buf = _buffers.take(nbytes)
        return (torch.from_numpy(buf).view(tdtype).reshape(shape),
                _byte_view(buf))
    if pin_memory:
        warnings.warn("pin_memory=True needs a torch result; a NumPy array is returned "
                      "in ordinary memory", stacklevel=3)
    buf = _buffers.take(nbytes)
    return buf.view(_np_dtype(dtype)).reshape(shape), _byte_view(buf)


def out_view(dtype: str, out: Any, shape: tuple[int, ...]) -> memoryview:
    """The flat byte view of a caller's ``out`` buffer, refused (``ValueError`` or
    ``TypeError`` naming what fits) unless it is a contiguous CPU tensor/array of
    ``dtype`` and ``shape``."""
    if _is_torch_tensor(out):
        torch = sys.modules["torch"]
        if (out.dtype != getattr(torch, dtype) or tuple(out.shape) != shape
                or out.device.type != "cpu" or not out.is_contiguous()):
            raise ValueError(f"out must be a contiguous CPU torch.{dtype} tensor of "
                             f"shape {list(shape)}, got {out.dtype} {list(out.shape)} on "
                             f"{out.device}")
        if out.numel() == 0:
            return memoryview(b"")
        flat = out.reshape(-1).view(torch.uint8).numpy()
    elif isinstance(out, np.ndarray):
        if (out.dtype != _np_dtype(dtype) or out.shape != shape
                or not out.flags.c_contiguous or not out.flags.writeable):
            raise ValueError(f"out must be a writable C-contiguous {_np_dtype(dtype)} "
                             f"array of shape {list(shape)}, got {out.dtype} "
                             f"{list(out.shape)}")
        flat = out.reshape(-1).view(np.uint8)
    else:
        raise TypeError(f"out must be a torch tensor or NumPy array, got "
                        f"{type(out).__name__}")
    return _byte_view(flat)


class ChunkReader:
    """Verified reads of one tensor record's payload through ``session``.  ``where`` is
    what ``TensorRef._checked`` authenticated: the chunk digests (16 bytes each), the pack
    path, the payload's offset there and the chunk size; ``nbytes`` is the payload's
    length and ``name`` the tensor's, for errors."""

    def __init__(self, session: ReadSession, where: tuple[bytes, str, int, int], nbytes: int,
                 name: str) -> None:
        self.session = session
        self.digests = where[0]
        self.loc = (where[1], where[2], where[3])  # pack path, payload offset, chunk size
        self.nbytes = nbytes
        self.name = name

    def read_into(self, start: int, stop: int, dst: memoryview) -> None:
        """Payload bytes [start, stop) into ``dst``, verifying every chunk touched."""
        if stop <= start:
            return
        digests, c = self.digests, self.loc[2]
        n = self.nbytes
        first, last = start // c, (stop - 1) // c  # chunks touched, inclusive
        inner_lo = first if start == first * c else first + 1
        inner_hi = last + 1 if stop == min((last + 1) * c, n) else last
        for k in sorted({first, last}):  # partial chunks: via a scratch buffer
            if inner_lo <= k < inner_hi:
                continue
            cs, ce = k * c, min((k + 1) * c, n)
            scratch = _byte_view(np.empty(ce - cs, dtype=np.uint8))
            self.read_chunks(digests, 0, k, k + 1, scratch, cs)
            a, b = max(start, cs), min(stop, ce)
            dst[a - start:b - start] = scratch[a - cs:b - cs]
        if inner_hi <= inner_lo:
            return
        self.read_chunks(digests, 0, inner_lo, inner_hi, dst, start)

    def read_chunks(self, expected: bytes, e0: int, lo: int, hi: int, dst: memoryview,
                    base: int) -> None:
        """Read whole chunks [lo, hi) into ``dst`` (which starts at payload byte ``base``),
        ``_READ_BYTES`` at a time, and verify each chunk right after its block landed,
        while it is still in the CPU cache.  ``expected`` holds the digests of the chunks
        from ``e0`` on.  The caller checked the record against its manifest, so the reads
        go straight to the session's block reader (which still handles visibility lag).

        A span of at least ``_PARALLEL_LOAD`` bytes is read by this thread and one pool
        thread together when ``_helpers`` judges a helper pays (it times such spans),
        each taking the next unread block from a shared ``_Blocks``
        (so a helper that gets no core leaves its share to this thread rather than
        making it wait): both the ``readinto`` and the hash (``xxhash.xxh3_128``, which
        releases the GIL, unlike ``xxh3_128_digest``) run without the GIL, so on two
        free cores the hashing no longer adds to the copy's time.  Every block is still
        hashed by the thread that read it, right after reading it."""
        c = self.loc[2]
        start, stop = lo * c, min(hi * c, self.nbytes)
        span = dst[start - base:stop - base]
        block = max(1, _READ_BYTES // c) * c
        if not (span.nbytes >= _PARALLEL_LOAD and span.nbytes > block):
            self._verify_blocks(expected, lo - e0, span, start, block, None)
            return
        # a large span: timed, so that the next ones know whether a helper pays
        two = _use_helper(span.nbytes)
        t0 = _helpers.timer()
        if two:
            self._verify_shared(expected, lo - e0, span, start, block)
        else:  # one thread: every block in order, hashed by the one-shot digest
            self._verify_blocks(expected, lo - e0, span, start, block, None)
        if two is not None:
            _helpers.record(two, span.nbytes, _helpers.timer() - t0)

    def _verify_shared(self, expected: bytes, j0: int, span: memoryview, start: int,
                       block: int) -> None:
        """``_verify_blocks`` of the whole span by this thread and one pool thread, each
        taking the next unread block; returns once the helper is done with ``span``."""
        blocks = _Blocks(span.nbytes, block)
        helper = _executor().submit(self._verify_blocks, expected, j0, span, start, block,
                                    blocks)
        try:
            self._verify_blocks(expected, j0, span, start, block, blocks)
        except BaseException:
            blocks.stop()  # the helper takes no further block of a load that failed
            raise
        finally:
            # the helper must be done with ``span`` before this returns: one queued behind
            # other work is cancelled (this thread read every block), a running one awaited
            if not helper.cancel():
                helper.exception()
        if not helper.cancelled():
            helper.result()  # its CorruptData (or other error), if any

    def _verify_blocks(self, expected: bytes, j0: int, span: memoryview, start: int,
                       block: int, blocks: _Blocks | None) -> None:
        """Read ``block``-byte blocks into ``span`` (payload bytes from ``start``): those
        taken from ``blocks``, shared with another thread, or all of them in order
        (None); verify each of their chunks (``expected`` from chunk index ``j0`` of the
        span on) right after the block landed."""
        session, (path, origin, c) = self.session, self.loc
        digest: Callable[[memoryview], bytes] = (
            xxhash.xxh3_128_digest if blocks is None
            # (xxh3_128_digest holds the GIL while hashing: the threads would take turns)
            else lambda piece: xxhash.xxh3_128(piece).digest())
        for a, b in session._read_blocks(path, origin + start, span, block, blocks):
            for pos in range(a, b, c):
                j = j0 + pos // c
                want = expected[j * 16:(j + 1) * 16]
                piece = span[pos:pos + c]  # (the last chunk may be shorter)
                if digest(piece) != want:
                    self._recheck(want, start // c + pos // c, piece, start + pos)

    def _recheck(self, want: bytes, chunk: int, view: memoryview, at: int) -> None:
        """Chunk ``chunk`` (payload bytes from ``at``, read into ``view``) failed its
        checksum on the block path: read it once more through ``_read_exact``, which
        looks the descriptor up afresh (the block path holds one for a whole load; had
        another thread of the session closed it and its number gone to another file, the
        bytes read were that file's), and check again.  Still wrong: the stored bytes are
        damaged, ``CorruptData`` (D6).  Right: ``view`` now holds verified bytes."""
        path, origin, c = self.loc
        self.session._read_exact(path, origin + at, view.nbytes, into=view)
        if xxhash.xxh3_128_digest(view) != want:
            raise self._corrupt(chunk, view.nbytes, path, origin, c)

    def _corrupt(self, chunk: int, size: int, path: str, origin: int, c: int
                 ) -> CorruptData:
        start = chunk * c
        return CorruptData(
            f"tensor {self.name!r} (record {self.name!r} at "
            f"{path} offset {origin}): chunk {chunk} "
            f"(bytes {start}..{start + size}) fails its checksum; the stored data is "
            "damaged. Restore the pool from a replica or republish the tensor")
