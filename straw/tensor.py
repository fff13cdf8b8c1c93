"""Tensors in packed publications: zero-copy writes, checked reads of whole tensors or rows.

``publish_tensors(store, {name: tensor}, *, submission_id)`` publishes NumPy arrays and
torch tensors (dtypes uint8, int8, int16, int32, int64, float16, bfloat16, float32,
float64, bool; any shape, scalars and empty tensors included) as ``tensor.v1`` records of
ONE publication on any store (``tensor.v1`` is a built-in codec), and returns one
``TensorRef`` per tensor, in the order of the mapping.

Record layout (``tensor.v1``)::

    payload   the tensor's bytes, C order, little-endian, written straight from the
              tensor's own memory (``writev`` of a view: no copy for a contiguous CPU
              tensor; a non-contiguous or CUDA tensor is made contiguous on the CPU first,
              autograd history is dropped)
    metadata  {"dtype": name, "shape": [...], "source": "torch"|"numpy",
               "chunk_bytes": C, "chunks": hex}   hex = the xxh3-128 of every C-byte chunk
              of the payload (the last one may be shorter), 32 hex digits each

``CHUNK_BYTES`` is 256 KiB: a one-row read of a float32 [8192, 1024] tensor (4 KiB rows)
reads and verifies one 256 KiB chunk, and a 32 MiB tensor carries 128 checksums (4 KiB of
metadata).  Every read verifies every chunk it touches and nothing else: ``load()`` all
of them, ``ref[a:b]`` only those overlapping rows ``a..b``.  The bytes go from the page
cache straight into the returned tensor's memory (``readinto`` of 1 MiB blocks through one
descriptor), and each chunk is hashed right after its block lands, while it is still in
the CPU cache: on these machines hashing from the cache takes about a third of the
copy's time, hashing the same bytes again from memory about two thirds.  One thread does
it: one core's copy already takes the memory bandwidth a second would share, and on the
two shared cores measured, helper threads (descheduled while holding the GIL or their
share of the work) made loads slower, not faster.  A chunk that fails its checksum is
read once more through a freshly looked-up descriptor (the one held for the load could
have been closed, its number reused for another file, by another thread of the session)
and, if it still fails, is ``CorruptData`` at once (D6); the chunk list itself lives in
the publication's manifest, which the reader authenticates.  A reference's
shape, dtype and record are checked against that manifest before any buffer is allocated
(an edited shape is ``InvalidReference``, never a terabyte allocation).  (``load()``
checks the chunk list rather than the record's whole-payload checksum: the same hashing
work, but done chunk by chunk while the bytes are in the cache.)
Large ``load()`` results live in recycled buffers (``_BufferCache``: a freed result's
memory is reused instead of faulting in fresh pages; ``set_load_buffer_cache`` bounds or
disables it).

What ``load()`` returns: a torch tensor when the tensor was published from torch and
torch is importable, else a NumPy array (``framework="torch"|"numpy"`` overrides).  A
0-d tensor loads as a 0-d tensor/array.  bfloat16 as NumPy: ``ml_dtypes.bfloat16`` when
``ml_dtypes`` is installed, else a ``uint16`` array of the raw bit patterns (the same
bytes; ``torch.from_numpy(a).view(torch.bfloat16)`` recovers the values).
``pin_memory=True`` reads into page-locked memory when torch has an accelerator; without
one it warns and returns ordinary memory (as torch's DataLoader does).  ``load(out=x)``
reads into an existing contiguous tensor/array of the same shape and dtype (for example
a reused pinned staging buffer) and allocates nothing; a buffer that does not fit is
refused (``ValueError``/``TypeError`` naming what fits) before anything is read, and
after a failed read (``CorruptData``, say) its content is unspecified.

``TensorRef`` is frozen and serialisable (``to_dict``/``from_dict``, pickle for Ray
drops the binding): it names the record (a ``RecordRef``), shape, dtype, source, chunk
size, and the pool root as the publisher saw it.  A ref returned by ``publish_tensors``
or ``from_record_set_many`` is bound to that store; ``ref.using(store)`` binds a
deserialised ref; an unbound ref opens (once per process) a read-only store at ``root``.

After ``fork()`` (``straw.process``): a ref bound to a store of the parent raises
``ForkedProcess`` in the child (rebind it with ``ref.using(store)`` to a store opened in
the child, or send it pickled: pickling drops the binding); an unbound ref reads through
a store of the child's own.  The module's thread pool, locks and store cache are reset in
the child (the parent's threads do not exist there, and a lock another thread held at the
fork would stay held forever).

torch is optional: this module imports it lazily, and works on NumPy alone.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import warnings
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

from .checks import check_count, short_repr
from .errors import CorruptData, ForkedProcess, InvalidReference, UnsupportedSchema
from .process import ProcessBound
from .reader import ReadSession
from .refs import Record, RecordInfo, RecordRef, RecordSetRef, payload_view
from .tensor_format import (
    CHUNK_BYTES,
    CODEC,
    DTYPES,
    SOURCES,
    _check_meta,
)
from .tensor_format import (
    MAX_DIMS as MAX_DIMS,
)

_READ_BYTES = 1 << 20  # one read call covers this much (whole chunks), hashed chunk by chunk
_PARALLEL_MIN = 8 << 20  # publish: chunk checksums of this much data on several threads


# --- optional dependencies --------------------------------------------------------------


def _torch() -> Any:
    """torch if importable (imported on first use), else None."""
    mod = sys.modules.get("torch")
    if mod is not None:
        return mod
    try:
        import torch
    except ImportError:
        return None
    return torch


def _is_torch_tensor(value: object) -> bool:
    mod = sys.modules.get("torch")  # a torch tensor implies torch is imported
    return mod is not None and isinstance(value, mod.Tensor)


def _np_dtype(name: str) -> np.dtype[Any]:
    """The NumPy dtype of a tensor.v1 dtype name (bfloat16: ml_dtypes, else uint16 bits)."""
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            return np.dtype(np.uint16)
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _workers() -> int:
    return min(4, os.cpu_count() or 1)


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(_workers(), thread_name_prefix="straw-tensor")
        return _pool


def _byte_view(a: Any) -> memoryview:
    """A flat byte memoryview of a contiguous buffer (NumPy arrays included)."""
    return memoryview(a).cast("B")


def _split(first: int, last: int, parts: int) -> list[tuple[int, int]]:
    """[first, last) cut into ``parts`` contiguous ranges."""
    n = last - first
    step = -(-n // parts)
    return [(a, min(a + step, last)) for a in range(first, last, step)]


class _BufferCache:
    """Recycled load buffers, so that a steady stream of loads does not page-fault.

    A fresh large allocation is an ``mmap`` whose every page faults, is zeroed by the
    kernel and, on a VM, may first have to be handed back by the host; that costs more
    than reading and verifying the tensor.  ``load()`` therefore takes its buffer from
    here: large slabs (at least ``MIN_BYTES``) that this cache owns.  Every array or
    tensor made from a slab keeps a reference to it (NumPy views reference their base,
    ``torch.from_numpy`` references the array), so a slab whose only reference is this
    cache's is unused and can be handed out again.  Tracked slabs total at most
    ``max_bytes`` (unused ones are dropped oldest first); ``set_load_buffer_cache(0)``
    turns the cache off.  Like any caching allocator it keeps up to ``max_bytes`` of
    unused memory around."""

    MIN_BYTES = 1 << 20

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.slabs: list[np.ndarray] = []
        self.lock = threading.Lock()

    @staticmethod
    def _refs(slab: np.ndarray) -> int:
        return sys.getrefcount(slab)

    def _free(self, i: int) -> bool:
        """Whether slab ``i`` is referenced by nothing but this cache (compared with the
        count of a slab that only the cache holds, measured once at start)."""
        return self._refs(self.slabs[i]) <= _UNUSED_REFS

    def take(self, nbytes: int) -> np.ndarray:
        if nbytes < self.MIN_BYTES or self.max_bytes <= 0:
            return np.empty(nbytes, dtype=np.uint8)
        with self.lock:
            for i in range(len(self.slabs)):
                if nbytes <= self.slabs[i].nbytes <= nbytes + (nbytes >> 2) \
                        and self._free(i):
                    slab = self.slabs.pop(i)
                    self.slabs.append(slab)  # most recently used last
                    return slab[:nbytes]
            size = -(-nbytes // self.MIN_BYTES) * self.MIN_BYTES
            total = sum(s.nbytes for s in self.slabs)
            i = 0
            while total + size > self.max_bytes and i < len(self.slabs):
                if self._free(i):
                    total -= self.slabs.pop(i).nbytes
                else:
                    i += 1
            if total + size > self.max_bytes:
                return np.empty(nbytes, dtype=np.uint8)
            slab = np.empty(size, dtype=np.uint8)
            self.slabs.append(slab)
            return slab[:nbytes]


def _unused_refs() -> int:
    probe = _BufferCache(0)
    probe.slabs.append(np.empty(1, dtype=np.uint8))
    return probe._refs(probe.slabs[0])


_UNUSED_REFS = _unused_refs()
_buffers = _BufferCache(512 << 20)


def set_load_buffer_cache(max_bytes: int) -> None:
    """Bound (in bytes) the memory of recycled ``load()`` buffers; 0 disables the cache."""
    check_count("max_bytes", max_bytes)
    with _buffers.lock:
        _buffers.max_bytes = max_bytes
        if max_bytes == 0:
            _buffers.slabs.clear()


# --- publishing -------------------------------------------------------------------------


def _tensor_bytes(value: object, where: str) -> tuple[np.ndarray, str, tuple[int, ...], str]:
    """(flat uint8 view of the bytes, dtype name, shape, source), without copying a
    contiguous little-endian CPU tensor."""
    if sys.byteorder != "little":
        raise UnsupportedSchema("tensor.v1 is little-endian; this host is big-endian")
    if _is_torch_tensor(value):
        torch = sys.modules["torch"]
        t = value.detach()  # type: ignore[attr-defined]
        if t.layout != torch.strided:
            raise TypeError(f"{where} is a {t.layout} torch tensor; pass a dense tensor "
                            "(.to_dense())")
        name = str(t.dtype).removeprefix("torch.")
        if name not in DTYPES:
            raise TypeError(f"{where} has dtype {name}; supported: {', '.join(DTYPES)}")
        if t.device.type != "cpu":
            t = t.to("cpu")
        t = t.resolve_conj().resolve_neg().contiguous()
        if t.numel() == 0:
            flat = np.empty(0, dtype=np.uint8)
        else:
            flat = t.reshape(-1).view(torch.uint8).numpy()
        return flat, name, tuple(int(d) for d in t.shape), "torch"
    if isinstance(value, (np.ndarray, np.generic)):
        a = np.asarray(value)
        name = a.dtype.name
        if name not in DTYPES or (a.dtype.kind == "V" and name != "bfloat16"):
            raise TypeError(f"{where} has dtype {a.dtype}; supported: {', '.join(DTYPES)}")
        if not a.dtype.isnative:
            a = a.astype(a.dtype.newbyteorder("="))
        if not a.flags.c_contiguous:
            a = a.copy(order="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
        return a.reshape(-1).view(np.uint8), name, tuple(a.shape), "numpy"
    raise TypeError(f"{where} is a {type(value).__name__}; publish a NumPy array or a torch "
                    "tensor (np.asarray(x) for Python numbers and lists)")


def chunk_checksums(data: np.ndarray, chunk_bytes: int = CHUNK_BYTES) -> str:
    """The hex xxh3-128 of every ``chunk_bytes`` chunk of ``data``, concatenated."""
    mv = _byte_view(data)
    n = mv.nbytes
    count = -(-n // chunk_bytes)

    def run(lo: int, hi: int) -> str:
        return "".join(xxhash.xxh3_128_hexdigest(mv[c * chunk_bytes:(c + 1) * chunk_bytes])
                       for c in range(lo, hi))

    if n < _PARALLEL_MIN or _workers() < 2:
        return run(0, count)
    return "".join(_executor().map(lambda r: run(*r), _split(0, count, _workers())))


def tensor_record(name: str, value: object, *, chunk_bytes: int = CHUNK_BYTES,
                  where: str | None = None) -> Record:
    """The ``tensor.v1`` record of one tensor (its payload is a view of the tensor)."""
    flat, dtype, shape, source = _tensor_bytes(value, where or f"tensors[{name!r}]")
    meta = {"dtype": dtype, "shape": list(shape), "source": source,
            "chunk_bytes": chunk_bytes, "chunks": chunk_checksums(flat, chunk_bytes)}
    return Record(name, flat, CODEC, meta)


def tensor_from_record(record: Record, *, where: str | None = None) -> np.ndarray:
    """The NumPy array an in-memory ``tensor.v1`` record holds (one ``tensor_record`` made,
    or ``store.read`` returned), its chunk checksums verified (``CorruptData`` on a
    mismatch, D6), copied out of the record's buffer.  Without a store, so without lazy
    reads: for those, use ``TensorRef``."""
    where = where or f"tensor record {getattr(record, 'record_id', '?')!r}"
    if not isinstance(record, Record) or record.codec != CODEC:
        raise UnsupportedSchema(f"{where} is not a {CODEC} record (codec "
                                f"{short_repr(getattr(record, 'codec', None))})")
    flat = np.frombuffer(payload_view(record.payload, where), dtype=np.uint8)
    dtype, shape, _, chunk_bytes, chunks = _check_meta(record.metadata, flat.nbytes, where)
    if chunk_checksums(flat, chunk_bytes) != chunks:
        raise CorruptData(f"{where}: its bytes do not match their chunk checksums; the "
                          "record was damaged or edited")
    return flat.view(_np_dtype(dtype)).reshape(shape).copy()


def publish_tensors(store: Any, tensors: Mapping[str, Any], *, submission_id: str,
                    dependencies: Sequence[RecordSetRef] = (),
                    chunk_bytes: int = CHUNK_BYTES) -> tuple[TensorRef, ...]:
    """Publish ``{name: tensor}`` as one publication; one ``TensorRef`` per tensor in the
    mapping's order, bound to ``store``.  Idempotent per ``submission_id`` (D7).
    ``chunk_bytes`` is the checksum granularity (default ``CHUNK_BYTES``)."""
    check_count("chunk_bytes", chunk_bytes, minimum=1)
    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors must be a mapping of name to tensor, got "
                        f"{type(tensors).__name__}")
    if not tensors:
        raise ValueError("tensors is empty; publish at least one tensor")
    records = []
    for name, value in tensors.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"tensor names must be non-empty str, got {name!r}")
        records.append(tensor_record(name, value, chunk_bytes=chunk_bytes))
    ref = store.publish(records, submission_id=submission_id, dependencies=dependencies)
    manifest = _session_of(store).checked_manifest(ref)
    root = getattr(store, "root", "")
    return tuple(_from_parts(rr, info, root, ref)._bound(store)
                 for rr, info in zip(manifest.record_refs, manifest.records, strict=True))


def release_tensor_publications(store: Any, tensors: Sequence[TensorRef]) -> list[RecordSetRef]:
    """Release the staging protection of the publications holding ``tensors`` (each
    publication once; sibling tensors published together go with it).  Readers must hold
    their own owner.  Returns the publications released.  Needs a store with retention
    (``release_publications``); never silently does nothing."""
    pubs: list[RecordSetRef] = []
    for i, t in enumerate(tensors):
        if not isinstance(t, TensorRef):
            raise TypeError(f"tensors[{i}] must be a TensorRef, got {type(t).__name__}")
        if t._publication() not in pubs:
            pubs.append(t._publication())
    release = getattr(store, "release_publications", None)
    if release is None:
        raise NotImplementedError(
            f"{type(store).__name__} has no release_publications (retention is not "
            "available in this store); nothing was released"
        )
    release(pubs)
    return pubs


# --- references -------------------------------------------------------------------------


def _from_parts(rref: RecordRef, info: RecordInfo, root: str, publication: RecordSetRef
                ) -> TensorRef:
    dtype, shape, source, chunk_bytes, _ = _check_meta(info.metadata, info.length,
                                                      f"tensor {info.record_id!r}")
    return TensorRef(rref, info.record_id, shape, dtype, source, chunk_bytes, root,
                     publication)


_auto_stores: dict[tuple[str, str], Any] = {}
_auto_lock = threading.Lock()


def _reset_after_fork() -> None:
    """In a forked child: the parent's pool threads do not exist there (work submitted to
    its pool would never run), a lock another thread held at the fork stays held, and the
    cached stores are the parent's (they refuse use in the child)."""
    global _pool, _pool_lock, _auto_stores, _auto_lock
    _pool = None  # never shut down: it is the parent's
    _pool_lock = threading.Lock()
    _auto_stores = {}
    _auto_lock = threading.Lock()
    _buffers.lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)


def _session_of(reader: Any) -> ReadSession:
    if isinstance(reader, ReadSession):
        return reader
    session = getattr(reader, "_session", None)
    if isinstance(session, ReadSession):
        return session
    raise TypeError(f"expected a SharedFilesystemStore or ReadSession, got "
                    f"{type(reader).__name__}")


@dataclass(frozen=True)
class TensorRef:
    """A published tensor: lazy, checked, frozen, serialisable.  ``load()``, ``ref[a:b]``
    (contiguous rows, step 1, negative indices as in Python), ``ref[i]`` (one row),
    ``share()``, ``updated()``; see the module docstring for what they return."""

    record: RecordRef
    name: str
    shape: tuple[int, ...]
    dtype: str
    source: str = "numpy"
    chunk_bytes: int = CHUNK_BYTES
    root: str = ""
    publication: RecordSetRef | None = None  # the publication it was published in
    # (``record`` is record ``ordinal`` of one extent; a tensor restored from a record
    # set of records of other extents names that record set here)
    # The binding (a store or ReadSession) is a plain attribute, not a field: it takes no
    # part in equality, hashing, repr, ``to_dict``, ``dataclasses.asdict`` or pickling.

    # --- description --------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype]

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def kind(self) -> str:
        """The tensor's name (straw-queue's word for it)."""
        return self.name

    @property
    def ordinal(self) -> int:
        return self.record.ordinal

    def _publication(self) -> RecordSetRef:
        if self.publication is None:
            raise InvalidReference(f"tensor {self.name!r} names no publication (a reference "
                                   "built without one); restore it with from_record_set")
        return self.publication

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError(f"tensor {self.name!r} is 0-d (a scalar) and has no length")
        return self.shape[0]

    # --- serialisation ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"record": self.record.to_dict(), "name": self.name,
                "shape": list(self.shape), "dtype": self.dtype, "source": self.source,
                "chunk_bytes": self.chunk_bytes, "root": self.root,
                "publication": None if self.publication is None else
                self.publication.to_dict()}

    @classmethod
    def from_dict(cls, value: Mapping[str, Any], store: Any = None) -> TensorRef:
        try:
            rref = RecordRef.from_dict(value["record"])
            pub = value.get("publication")
            if pub is None and "record_set" in value["record"]:  # the previous straw's form
                pub = value["record"]["record_set"]
            ref = cls(rref, value["name"], tuple(value["shape"]), value["dtype"],
                      value["source"], value["chunk_bytes"], value.get("root", ""),
                      None if pub is None else RecordSetRef.from_dict(pub))
        except (KeyError, TypeError):
            raise InvalidReference(f"not a TensorRef dict: {short_repr(value)}") from None
        if (ref.dtype not in DTYPES or ref.source not in SOURCES
                or not isinstance(ref.chunk_bytes, int) or ref.chunk_bytes <= 0
                or any(not isinstance(d, int) or d < 0 for d in ref.shape)
                or len(ref.shape) > MAX_DIMS):
            raise InvalidReference(f"not a valid TensorRef dict: {short_repr(value)}")
        return ref._bound(store) if store is not None else ref

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:  # pickling (Ray) drops the binding
        return (TensorRef.from_dict, (self.to_dict(),))

    # --- binding ------------------------------------------------------------------------
    def _bound(self, reader: Any) -> TensorRef:
        object.__setattr__(self, "_reader", reader)
        return self

    def using(self, reader: Any) -> TensorRef:
        """A copy of this reference that reads through ``reader`` (a store of the same run,
        or a ``ReadSession``)."""
        session = _session_of(reader)
        if session.run_id != self.record.segment.run_id:
            raise InvalidReference(f"tensor {self.name!r} belongs to run "
                                   f"{self.record.segment.run_id!r}, the reader to "
                                   f"{session.run_id!r}")
        ref = TensorRef(self.record, self.name, self.shape, self.dtype, self.source,
                        self.chunk_bytes, self.root, self.publication)
        return ref._bound(reader)

    def _session(self) -> ReadSession:
        reader = getattr(self, "_reader", None)
        if reader is not None:
            if isinstance(reader, ProcessBound) and reader._in_forked_child():
                raise ForkedProcess(
                    f"tensor {self.name!r} is bound to a reader of another process: "
                    f"{reader._forked_message()}; then rebind the reference with "
                    "ref.using(store), or send it to the child pickled (an unpickled "
                    "TensorRef reads through a store of its own process)")
            return _session_of(reader)
        run_id = self.record.segment.run_id
        key = (self.root, run_id)
        with _auto_lock:
            store = _auto_stores.get(key)
            if store is None:
                from .fs import PosixFS
                from .store import SharedFilesystemStore

                if not self.root or not PosixFS().exists(os.path.join(self.root, "POOL")):
                    raise InvalidReference(
                        f"tensor {self.name!r}: no pool at {self.root!r} on this machine; "
                        "bind the reference to a store with ref.using(store)")
                store = SharedFilesystemStore(self.root, run_id)
                _auto_stores[key] = store
        return _session_of(store)

    # --- reading ------------------------------------------------------------------------
    def _chunks(self, session: ReadSession) -> tuple[str, str, int]:
        """The authenticated chunk checksums, pack path and payload offset of the
        record, after checking its checked manifest entry agrees with this reference."""
        info: RecordInfo
        info, path, origin = session.payload_location(self.record)
        if info.codec != CODEC:
            raise InvalidReference(f"record {info.record_id!r} has codec {info.codec!r}, not "
                                   f"{CODEC}")
        dtype, shape, source, chunk_bytes, chunks = _check_meta(
            info.metadata, info.length, f"tensor {self.name!r}")
        if (dtype, shape, source, chunk_bytes) != (self.dtype, self.shape, self.source,
                                                   self.chunk_bytes):
            raise InvalidReference(
                f"tensor {self.name!r}: the reference says {self.dtype}{list(self.shape)}, "
                f"the publication holds {dtype}{list(shape)} (edited or stale reference)")
        return chunks, path, origin

    def _checked(self, session: ReadSession) -> tuple[bytes, str, int]:
        """The authenticated chunk digests (16 bytes each), pack path and payload offset,
        after ``_chunks`` checked the manifest against this reference: once per session
        (a reference never changes, nor does a publication, so the answer would be the
        same every time; each read still checks its path and opens nothing outside the
        pool).  Remembered on the reference like its binding (not a field: ``using``,
        pickling and ``from_dict`` make references that check again).  On a 12 MiB tensor
        the check and the hex decoding cost about 5% of a cache-warm load."""
        memo = getattr(self, "_checked_memo", None)
        if memo is not None and memo[0] is session:
            return memo[1]
        chunks, path, origin = self._chunks(session)
        where = (bytes.fromhex(chunks), path, origin)
        object.__setattr__(self, "_checked_memo", (session, where))
        return where

    def _corrupt(self, chunk: int, size: int, path: str, origin: int) -> CorruptData:
        start = chunk * self.chunk_bytes
        return CorruptData(
            f"tensor {self.name!r} (record {self.name!r} at "
            f"{path} offset {origin}): chunk {chunk} "
            f"(bytes {start}..{start + size}) fails its checksum; the stored data is "
            "damaged. Restore the pool from a replica or republish the tensor")

    def _read_chunks(self, session: ReadSession, loc: tuple[str, int], expected: bytes,
                     e0: int, lo: int, hi: int, dst: memoryview, base: int) -> None:
        """Read whole chunks [lo, hi) into ``dst`` (which starts at payload byte ``base``),
        ``_READ_BYTES`` at a time, and verify each chunk right after its block landed,
        while it is still in the CPU cache.  ``expected`` holds the digests of the chunks
        from ``e0`` on.  The caller checked the record against its manifest, so the reads
        go straight to the session's block reader (which still handles visibility lag)."""
        c = self.chunk_bytes
        path, origin = loc
        start, stop = lo * c, min(hi * c, self.nbytes)
        span = dst[start - base:stop - base]
        digest = xxhash.xxh3_128_digest
        for a, b in session._read_blocks(path, origin + start, span,
                                         max(1, _READ_BYTES // c) * c):
            for pos in range(a, b, c):
                j = lo - e0 + pos // c
                want = expected[j * 16:(j + 1) * 16]
                piece = span[pos:pos + c]  # (the last chunk may be shorter)
                if digest(piece) != want:
                    self._recheck(session, loc, want, lo + pos // c, piece, start + pos)

    def _recheck(self, session: ReadSession, loc: tuple[str, int], want: bytes, chunk: int,
                 view: memoryview, at: int) -> None:
        """Chunk ``chunk`` (payload bytes from ``at``, read into ``view``) failed its
        checksum on the block path: read it once more through ``_read_exact``, which
        looks the descriptor up afresh (the block path holds one for a whole load; had
        another thread of the session closed it and its number gone to another file, the
        bytes read were that file's), and check again.  Still wrong: the stored bytes are
        damaged, ``CorruptData`` (D6).  Right: ``view`` now holds verified bytes."""
        path, origin = loc
        session._read_exact(path, origin + at, view.nbytes, into=view)
        if xxhash.xxh3_128_digest(view) != want:
            raise self._corrupt(chunk, view.nbytes, path, origin)

    def _read_into(self, session: ReadSession, where: tuple[bytes, str, int], start: int,
                   stop: int, dst: memoryview) -> None:
        """Payload bytes [start, stop) into ``dst``, verifying every chunk touched
        (``where``: the authenticated digests, path and offset from ``_checked``)."""
        if stop <= start:
            return
        digests, loc = where[0], (where[1], where[2])
        c = self.chunk_bytes
        n = self.nbytes
        first, last = start // c, (stop - 1) // c  # chunks touched, inclusive
        inner_lo = first if start == first * c else first + 1
        inner_hi = last + 1 if stop == min((last + 1) * c, n) else last
        for k in sorted({first, last}):  # partial chunks: via a scratch buffer
            if inner_lo <= k < inner_hi:
                continue
            cs, ce = k * c, min((k + 1) * c, n)
            scratch = _byte_view(np.empty(ce - cs, dtype=np.uint8))
            self._read_chunks(session, loc, digests, 0, k, k + 1, scratch, cs)
            a, b = max(start, cs), min(stop, ce)
            dst[a - start:b - start] = scratch[a - cs:b - cs]
        if inner_hi <= inner_lo:
            return
        self._read_chunks(session, loc, digests, 0, inner_lo, inner_hi, dst, start)

    def _want_torch(self, framework: str | None) -> bool:
        if framework not in (None, "torch", "numpy"):
            raise ValueError(f"framework must be None, 'torch' or 'numpy', got {framework!r}")
        if framework == "numpy":
            return False
        if framework == "torch":
            if _torch() is None:
                raise ImportError("framework='torch' needs torch, which is not importable")
            return True
        return self.source == "torch" and _torch() is not None

    def _alloc(self, shape: tuple[int, ...], as_torch: bool, pin_memory: bool
               ) -> tuple[Any, memoryview]:
        """An uninitialised tensor/array of ``shape`` and its flat byte view."""
        nbytes = math.prod(shape) * self.itemsize
        if as_torch:
            torch = _torch()
            tdtype = getattr(torch, self.dtype)
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
        return buf.view(_np_dtype(self.dtype)).reshape(shape), _byte_view(buf)

    def _out_view(self, out: Any, shape: tuple[int, ...]) -> memoryview:
        if _is_torch_tensor(out):
            torch = sys.modules["torch"]
            if (out.dtype != getattr(torch, self.dtype) or tuple(out.shape) != shape
                    or out.device.type != "cpu" or not out.is_contiguous()):
                raise ValueError(f"out must be a contiguous CPU torch.{self.dtype} tensor of "
                                 f"shape {list(shape)}, got {out.dtype} {list(out.shape)} on "
                                 f"{out.device}")
            if out.numel() == 0:
                return memoryview(b"")
            flat = out.reshape(-1).view(torch.uint8).numpy()
        elif isinstance(out, np.ndarray):
            if (out.dtype != _np_dtype(self.dtype) or out.shape != shape
                    or not out.flags.c_contiguous or not out.flags.writeable):
                raise ValueError(f"out must be a writable C-contiguous {_np_dtype(self.dtype)} "
                                 f"array of shape {list(shape)}, got {out.dtype} "
                                 f"{list(out.shape)}")
            flat = out.reshape(-1).view(np.uint8)
        else:
            raise TypeError(f"out must be a torch tensor or NumPy array, got "
                            f"{type(out).__name__}")
        return _byte_view(flat)

    def _materialise(self, row0: int, rows: int | None, *, pin_memory: bool, out: Any,
                     framework: str | None) -> Any:
        # The reference is checked against its authenticated manifest (shape, dtype and
        # record length agree, so the size below is the real payload's) before anything
        # is allocated: an edited shape must not allocate terabytes.
        session = self._session()
        where = self._checked(session)
        if rows is None:
            shape, start, stop = self.shape, 0, self.nbytes
        else:
            row = math.prod(self.shape[1:]) * self.itemsize
            shape, start, stop = (rows, *self.shape[1:]), row0 * row, (row0 + rows) * row
        if out is not None:
            view = self._out_view(out, shape)
            self._read_into(session, where, start, stop, view)
            return out
        result, view = self._alloc(shape, self._want_torch(framework), pin_memory)
        self._read_into(session, where, start, stop, view)
        return result

    def load(self, *, pin_memory: bool = False, out: Any = None,
             framework: str | None = None, reader: Any = None) -> Any:
        """The whole tensor, every chunk verified (see the module docstring for the type
        returned, ``pin_memory`` and ``out``).  ``reader`` reads through another store or
        session of the same run for this call."""
        if reader is not None:
            return self.using(reader).load(pin_memory=pin_memory, out=out,
                                           framework=framework)
        return self._materialise(0, None, pin_memory=pin_memory, out=out,
                                 framework=framework)

    def rows(self, start: int, stop: int, *, pin_memory: bool = False, out: Any = None,
             framework: str | None = None) -> Any:
        """Rows [start, stop) (Python slice rules), verifying only the chunks they touch;
        the options of ``load``."""
        return self._slice(slice(start, stop), pin_memory=pin_memory, out=out,
                           framework=framework)

    def _slice(self, key: slice, **kw: Any) -> Any:
        if not self.shape:
            raise TypeError(f"tensor {self.name!r} is 0-d (a scalar) and cannot be sliced; "
                            "use load()")
        if key.step not in (None, 1):
            raise ValueError(f"tensor {self.name!r}: row slices must be contiguous (step 1), "
                             f"got step {key.step!r}")
        start, stop, _ = key.indices(self.shape[0])
        return self._materialise(start, max(0, stop - start), **kw)

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, slice):
            return self._slice(key, pin_memory=False, out=None, framework=None)
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            if not self.shape:
                raise TypeError(f"tensor {self.name!r} is 0-d (a scalar) and cannot be "
                                "indexed; use load()")
            i = int(key)
            if not -self.shape[0] <= i < self.shape[0]:
                raise IndexError(f"row {i} out of range for tensor {self.name!r} with "
                                 f"{self.shape[0]} rows")
            i %= self.shape[0]
            return self._slice(slice(i, i + 1), pin_memory=False, out=None, framework=None)[0]
        raise TypeError(f"tensor {self.name!r} supports row slices ref[a:b] and rows ref[i], "
                        f"not {type(key).__name__} indices")

    # --- sharing and new versions -------------------------------------------------------
    def share(self, store: Any = None, *, submission_id: str | None = None
              ) -> tuple[RecordSetRef, int]:
        """``(publication, ordinal)``: the descriptor another publication or queue reuses
        (as a dependency) without copying bytes.  The tensor already lives in its own
        publication, so nothing is written (``submission_id`` is accepted for
        straw-queue compatibility and not needed).  With ``store``, checks that it is of
        the same run."""
        del submission_id
        pub = self._publication()
        if store is not None and getattr(store, "run_id", None) != pub.run_id:
            raise InvalidReference(f"tensor {self.name!r} belongs to run "
                                   f"{pub.run_id!r}; it can only be shared "
                                   f"within that run, not with {store!r}")
        if pub.segment == self.record.segment:  # its own extent: ordinals agree
            return pub, self.ordinal
        # a record set naming records of other extents: its position there
        return pub, self._session().checked_manifest(pub).record_refs.index(self.record)

    def updated(self, store: Any, values: Any, *, submission_id: str,
                rows: Any = None) -> TensorRef:
        """Copy-on-write: a new version of this tensor published by ``store`` (this one
        stays untouched).  ``rows=None`` replaces the whole tensor with ``values`` (same
        shape); otherwise ``loaded[rows] = values`` on a loaded copy."""
        current = self.load()
        if rows is None:
            new = values
            got = tuple(values.shape) if hasattr(values, "shape") else None
            if got != self.shape:
                raise ValueError(f"updated(): values of shape {got} for tensor {self.name!r} "
                                 f"of shape {list(self.shape)}; pass rows= to update part")
        else:
            if _is_torch_tensor(current):
                current[rows] = sys.modules["torch"].as_tensor(values, dtype=current.dtype)
            else:
                current[rows] = np.asarray(values)
            new = current
        return publish_tensors(store, {self.name: new}, submission_id=submission_id)[0]

    # --- restoring ----------------------------------------------------------------------
    @classmethod
    def from_record_set_many(cls, store: Any, reference: RecordSetRef, *,
                             reader: Any = None) -> dict[int, TensorRef]:
        """Every tensor of a publication by ordinal (other records are left out), bound to
        ``store``; reads only the manifest (through ``reader``, a read session of the same
        run, when given: straw-queue's keyword)."""
        session = _session_of(store if reader is None else reader)
        if session.run_id != getattr(store, "run_id", session.run_id):
            raise InvalidReference(f"reader of run {session.run_id!r} cannot restore tensors "
                                   f"for a store of run {store.run_id!r}")
        manifest = session.checked_manifest(reference)
        root = getattr(store, "root", "")
        return {i: _from_parts(rref, info, root, reference)._bound(store)
                for i, (info, rref) in enumerate(zip(manifest.records, manifest.record_refs,
                                                     strict=True))
                if info.codec == CODEC}

    @classmethod
    def from_record_set(cls, store: Any, reference: RecordSetRef, ordinal: int = 0, *,
                        reader: Any = None) -> TensorRef:
        """The tensor at ``ordinal`` of a publication."""
        tensors = cls.from_record_set_many(store, reference, reader=reader)
        if ordinal not in tensors:
            raise InvalidReference(f"record {ordinal} of {reference!r} is not a tensor")
        return tensors[ordinal]


def _can_pin(torch: Any) -> bool:
    try:
        if torch.cuda.is_available():
            return True
        acc = getattr(torch, "accelerator", None)
        if acc is not None and acc.is_available():
            return True
    except Exception:  # a broken driver setup: behave as if there were none
        pass
    warnings.warn("pin_memory=True but torch has no accelerator; returning ordinary "
                  "(pageable) memory", stacklevel=5)
    return False


__all__ = ["CHUNK_BYTES", "DTYPES", "TensorRef", "chunk_checksums", "publish_tensors",
           "release_tensor_publications", "set_load_buffer_cache", "tensor_record",
           "tensor_from_record"]
