"""``TensorRef``: a published tensor, lazy, checked, frozen and serialisable; and how
references are made from a publication's manifest.

What ``load()`` returns: a torch tensor whenever torch is importable, whatever the tensor
was published from (straw-queue's rule: its callers use the result as torch), else a
NumPy array (``framework="torch"|"numpy"`` overrides).  A 0-d tensor loads as a 0-d
tensor/array.  bfloat16 as NumPy: ``ml_dtypes.bfloat16`` when ``ml_dtypes`` is installed,
else a ``uint16`` array of the raw bit patterns (the same bytes;
``torch.from_numpy(a).view(torch.bfloat16)`` recovers the values).  ``pin_memory=True``
reads into page-locked memory when torch has an accelerator; without one it warns and
returns ordinary memory (as torch's DataLoader does).  ``load(out=x)`` reads into an
existing contiguous tensor/array of the same shape and dtype (for example a reused pinned
staging buffer) and allocates nothing; a buffer that does not fit is refused
(``ValueError``/``TypeError`` naming what fits) before anything is read, and after a
failed read (``CorruptData``, say) its content is unspecified.  A reference's shape,
dtype and record are checked against the publication's authenticated manifest before
any buffer is allocated (an edited shape is ``InvalidReference``, never a terabyte
allocation); the reads themselves are ``straw.tensors.loads``.

``TensorRef`` is frozen and serialisable (``to_dict``/``from_dict``, ``dataclasses.asdict``
and ``TensorRef(**fields)``, pickle for Ray: the binding dropped).  Its fields are
straw-queue 0.1.6's (see the class), then ours.  A ref returned by ``publish_tensors`` or
``from_record_set_many`` is bound to that store; ``ref.using(store)`` binds a
deserialised ref; an unbound ref opens (once per process) a read-only store at ``root``.

Which pool a reference belongs to, and what a bound reference does after ``fork()``: see
``straw.tensors.binding``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import tracing
from ..checks import short_repr
from ..errors import ForkedProcess, InvalidReference, TensorMismatch, UnsupportedSchema
from ..pool.records import Record, RecordInfo
from ..pool.refs import RecordRef, RecordSetRef
from ..process import ProcessBound
from ..read.ranges import checked_span
from ..read.session import ReadSession
from .binding import _check_same_pool, _pool_id_of, _session_of, own_store
from .format import CHUNK_BYTES, CODEC, DTYPES, MAX_DIMS, _check_meta
from .frameworks import _is_torch_tensor, _torch
from .loads import ChunkReader, allocate, out_view, want_torch
from .records import _granularity, tensor_records
from .serial import _DEFAULT_CODECS, check_fields, fields_of, from_earlier


def _from_parts(rref: RecordRef, info: RecordInfo, store: Any,
                publication: RecordSetRef | None, ordinal: int, *, validated: bool = False
                ) -> TensorRef:
    """The reference of record ``rref`` (its checked manifest entry ``info``), member
    ``ordinal`` of ``publication``, read through ``store`` (a store or a ReadSession)."""
    dtype, shape, source, chunk_bytes, _ = _check_meta(info.metadata, info.length,
                                                      f"tensor {info.record_id!r}")
    kind = info.metadata.get("kind")
    if not isinstance(kind, str) or not kind:
        # a record of an older straw (its record id was the name) or one without a kind
        kind = info.record_id if "kind" not in info.metadata else None
    root = getattr(store, "root", "")
    codecs = getattr(store, "codecs", None)
    return TensorRef(
        path=os.path.join(root, rref.segment.path) if root else rref.segment.path,
        shape=shape, dtype=dtype, nbytes=info.length, kind=kind, validated=validated,
        codecs=tuple(sorted(codecs)) if codecs else _DEFAULT_CODECS, record_ref=rref,
        root=root, run_id=rref.segment.run_id, blob_set=publication, blob_ordinal=ordinal,
        source=source, chunk_bytes=chunk_bytes, pool_id=_pool_id_of(store))


def published(store: Any, records: Sequence[Record], *, submission_id: str,
              dependencies: Sequence[RecordSetRef]) -> tuple[TensorRef, ...]:
    """Publish the ``tensor.v1`` ``records`` as one publication through ``store``; one
    ``TensorRef`` per record, bound to ``store`` and marked validated."""
    ref = store.publish(records, submission_id=submission_id, dependencies=dependencies)
    manifest = _session_of(store).checked_manifest(ref)
    return tuple(_from_parts(rr, info, store, ref, i, validated=True)._bound(store)
                 for i, (rr, info) in enumerate(zip(manifest.record_refs, manifest.records,
                                                    strict=True)))


@dataclass(frozen=True)
class TensorRef:
    """A published tensor: lazy, checked, frozen, serialisable.  ``load()``, ``ref[a:b]``
    (contiguous rows, step 1, negative indices as in Python), ``ref[i]`` (one row),
    ``validate()``, ``share()``, ``updated()``; see the module docstring for what they
    return.

    The fields are straw-queue 0.1.6's, in its order (a caller constructs, replaces,
    pickles and compares them), then ours.  What reads use: ``record_ref`` (the record),
    ``shape``/``dtype``/``nbytes`` (checked against the record's authenticated manifest
    entry before anything is allocated: a disagreement is ``TensorMismatch``),
    ``run_id``/``pool_id`` (which pool and run the reference belongs to), ``root`` (where
    an unbound reference opens a store), ``blob_set``/``blob_ordinal`` (its publication
    and position there, for ``share``).  Carried, never followed: ``path`` (the pack as
    the publisher saw it: reads go through ``record_ref`` beneath the reader's own root),
    ``codecs``, ``offset``/``checksum`` (straw-queue's placeholders, -1/None).
    ``validated`` is a caller's flag (straw-queue sets it on a publisher's references);
    every read checks regardless.  Ours: ``source`` (the framework it was published
    from), ``chunk_bytes`` (checksum granularity), ``pool_id``."""

    path: str
    shape: tuple[int, ...]
    dtype: str
    nbytes: int
    kind: str | None = None  # the tensor's name in its publication
    validated: bool = False
    offset: int | None = -1
    checksum: int | None = None
    codecs: tuple[str, ...] = _DEFAULT_CODECS
    record_ref: RecordRef | None = None
    root: str = ""
    run_id: str = ""
    blob_set: RecordSetRef | None = None  # the publication it is a member of
    blob_ordinal: int = 0  # its position among that publication's records
    source: str = ""  # ours: "torch"/"numpy", what it was published from ("" unknown)
    chunk_bytes: int = CHUNK_BYTES  # ours
    pool_id: str | None = None  # ours: SharedFilesystemStore.pool_id of its pool
    # The binding (a store or ReadSession) is a plain attribute, not a field: it takes no
    # part in equality, hashing, repr, ``to_dict``, ``dataclasses.asdict`` or pickling.

    def __post_init__(self) -> None:
        # a JSON round trip (``TensorRef(**json.loads(...))``) gives lists: compare and
        # hash as tuples
        if not isinstance(self.shape, tuple):
            object.__setattr__(self, "shape", tuple(self.shape))
        if not isinstance(self.codecs, tuple):
            object.__setattr__(self, "codecs", tuple(self.codecs))

    # --- description --------------------------------------------------------------------
    @property
    def record(self) -> RecordRef:
        """The record (``record_ref``; straw's earlier name)."""
        if self.record_ref is None:
            raise InvalidReference(f"tensor {self.name!r} names no record (record_ref is "
                                   "None); restore it with TensorRef.from_record_set")
        return self.record_ref

    @property
    def name(self) -> str:
        """Its ``kind`` (the name it was published under), else its record's position."""
        if self.kind is not None:
            return self.kind
        return "?" if self.record_ref is None else f"record {self.record_ref.ordinal}"

    @property
    def publication(self) -> RecordSetRef | None:
        """The publication it is a member of (``blob_set``)."""
        return self.blob_set

    @property
    def itemsize(self) -> int:
        return DTYPES[self._dtype()]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def ordinal(self) -> int:
        """The record's position in its extent (``record_ref.ordinal``)."""
        return self.record.ordinal

    @property
    def torch_dtype(self) -> Any:
        torch = _torch()
        if torch is None:
            raise ImportError("torch_dtype needs torch, which is not importable")
        return getattr(torch, self._dtype())

    def _dtype(self) -> str:
        if self.dtype not in DTYPES:
            raise UnsupportedSchema(f"tensor {self.name!r}: dtype {self.dtype!r} is unknown "
                                    f"(knows {', '.join(DTYPES)})")
        return self.dtype

    def _publication(self) -> RecordSetRef:
        if self.blob_set is None:
            raise InvalidReference(f"tensor {self.name!r} names no publication (a reference "
                                   "built without one); restore it with from_record_set")
        return self.blob_set

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError(f"tensor {self.name!r} is 0-d (a scalar) and has no length")
        return self.shape[0]

    # --- serialisation ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Every field, JSON-ready (``from_dict`` reverses it)."""
        return {"path": self.path, "shape": list(self.shape), "dtype": self.dtype,
                "nbytes": self.nbytes, "kind": self.kind, "validated": self.validated,
                "offset": self.offset, "checksum": self.checksum,
                "codecs": list(self.codecs),
                "record_ref": None if self.record_ref is None else self.record_ref.to_dict(),
                "root": self.root, "run_id": self.run_id,
                "blob_set": None if self.blob_set is None else self.blob_set.to_dict(),
                "blob_ordinal": self.blob_ordinal, "source": self.source,
                "chunk_bytes": self.chunk_bytes, "pool_id": self.pool_id}

    @classmethod
    def from_dict(cls, value: Mapping[str, Any], store: Any = None) -> TensorRef:
        """A reference from ``to_dict`` (or an earlier straw's form), checked field by
        field (``InvalidReference`` naming what is wrong); bound to ``store`` if given."""
        if not isinstance(value, Mapping):
            raise InvalidReference(f"not a TensorRef dict: {short_repr(value)}")
        if "record" in value:  # an earlier straw's form
            value = from_earlier(value)
        try:
            ref = cls(**fields_of(value))
        except (KeyError, TypeError, ValueError):
            raise InvalidReference(f"not a TensorRef dict: {short_repr(value)}") from None
        check_fields(ref, value)
        return ref._bound(store) if store is not None else ref

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:  # pickling (Ray) drops the binding
        return (_unpickle, (self._state(),))

    def _state(self) -> tuple[Any, ...]:
        """The fields as a tuple, the publication's manifest segment left out when it is
        the record's own (the common case): a pickled reference stays well under 1 KiB."""
        pub: Any = self.blob_set
        if pub is not None and self.record_ref is not None \
                and pub.manifest.segment == self.record_ref.segment:
            pub = (pub.manifest.ordinal, pub.digest, pub.records, pub.payload_bytes,
                   pub.tokens)
        return (self.path, self.shape, self.dtype, self.nbytes, self.kind, self.validated,
                self.offset, self.checksum,
                None if self.codecs == _DEFAULT_CODECS else self.codecs, self.record_ref,
                self.root, self.run_id, pub, self.blob_ordinal, self.source,
                self.chunk_bytes, self.pool_id)

    # --- binding ------------------------------------------------------------------------
    def _bound(self, reader: Any) -> TensorRef:
        object.__setattr__(self, "_reader", reader)
        return self

    def _pool_error(self, reader: Any, why: str) -> InvalidReference:
        """The error for a reader of a different storage pool or run: names both."""
        theirs = _pool_id_of(reader)
        return InvalidReference(
            f"tensor {self.name!r} belongs to run {self.run_id!r} of pool "
            f"{self.pool_id or '(id unknown)'} at {self.root or '(root unknown)'}; the "
            f"reader is of run {getattr(reader, 'run_id', '?')!r} of pool "
            f"{theirs or '(id unknown)'} at {getattr(reader, 'root', '?')}: {why} (a "
            "different storage pool or run). Read it through a store of its own pool")

    def _check_reader(self, reader: Any) -> None:
        """``InvalidReference`` at once, before any read, unless ``reader`` (a store or
        session) is of this reference's run and pool.  Pools are compared by id; a
        reference or pool without one (an older straw's) cannot be told apart, and is
        only checked by run."""
        if getattr(reader, "run_id", None) != self._run():
            raise self._pool_error(reader, "another run")
        theirs = _pool_id_of(reader)
        if self.pool_id is not None and theirs is not None and theirs != self.pool_id:
            raise self._pool_error(reader, "another pool with the same run id")

    def _run(self) -> str:
        return self.run_id or self.record.segment.run_id

    def shares_storage(self, store: Any) -> bool:
        """Whether ``store`` is of this reference's pool and run (so the tensor can be
        shared with it, or read through it, without copying)."""
        try:
            self._check_reader(store)
        except InvalidReference:
            return False
        return True

    def using(self, reader: Any) -> TensorRef:
        """A copy of this reference that reads through ``reader`` (a store of the same pool
        and run, or a ``ReadSession``); ``InvalidReference`` at once otherwise."""
        _session_of(reader)  # (a TypeError for anything else)
        self._check_reader(reader)
        return dataclasses.replace(self)._bound(reader)

    def _session(self) -> ReadSession:
        reader = getattr(self, "_reader", None)
        if reader is not None:
            if isinstance(reader, ProcessBound) and reader._in_forked_child():
                raise ForkedProcess(
                    f"tensor {self.name!r} is bound to a reader of another process: "
                    f"{reader._forked_message()}; then rebind the reference with "
                    "ref.using(store), or send it to the child pickled (an unpickled "
                    "TensorRef reads through a store of its own process)")
            session = _session_of(reader)
            if not (session.closed or getattr(reader, "closed", False)):
                return session
            # Its store (or session) was closed since, e.g. at the end of the ``with``
            # block that published the tensor: a TensorRef is metadata that holds no
            # descriptor of its own (straw-queue's), so it reads as an unpickled one does,
            # through this process's store of its pool (same checks: run and pool id,
            # every chunk's checksum, the record beneath the pool root).
            return self._own_session(self.root or getattr(reader, "root", ""))
        return self._own_session(self.root)

    def _own_session(self, root: str) -> ReadSession:
        """A read session of this process's own store of the pool at ``root`` (opened
        once per pool and run, then shared), for a reference bound to no open reader."""
        store = own_store(root, self._run(), self.name)
        self._check_reader(store)  # the root may hold another pool on this machine
        return _session_of(store)

    # --- reading ------------------------------------------------------------------------
    def _check_shape(self) -> None:
        """The reference's own fields agree (shape x dtype = nbytes), before any I/O."""
        if (not isinstance(self.nbytes, int) or isinstance(self.nbytes, bool)
                or self.nbytes < 0 or len(self.shape) > MAX_DIMS
                or any(not isinstance(d, int) or isinstance(d, bool) or d < 0
                       for d in self.shape)
                or math.prod(self.shape) * DTYPES[self._dtype()] != self.nbytes):
            raise TensorMismatch(
                f"Typed tensor reference {self.name!r} is inconsistent: shape "
                f"{list(self.shape)} of {self.dtype} does not make nbytes {self.nbytes!r} "
                "(an edited or stale reference); restore it with TensorRef.from_record_set")

    def _chunks(self, session: ReadSession) -> tuple[str, str, int, int]:
        """The authenticated chunk checksums, pack path and payload offset of the
        record and its chunk size, after checking its checked manifest entry agrees with
        this reference."""
        self._check_shape()
        info: RecordInfo
        info, path, origin = session.payload_location(self.record)
        if info.codec != CODEC:
            raise InvalidReference(f"record {info.record_id!r} has codec {info.codec!r}, not "
                                   f"{CODEC}")
        dtype, shape, _, chunk_bytes, chunks = _check_meta(
            info.metadata, info.length, f"tensor {self.name!r}")
        if (dtype, shape, info.length) != (self.dtype, self.shape, self.nbytes):
            raise TensorMismatch(
                f"Typed tensor reference {self.name!r} disagrees with its published record: "
                f"the reference says {self.dtype}{list(self.shape)} ({self.nbytes} bytes), "
                f"the publication holds {dtype}{list(shape)} ({info.length} bytes) (an "
                "edited or stale reference); restore it with TensorRef.from_record_set")
        # (the record's chunk size is authoritative: the reference only carries it)
        return chunks, path, origin, chunk_bytes

    def _checked(self, session: ReadSession) -> tuple[bytes, str, int, int]:
        """The authenticated chunk digests (16 bytes each), pack path, payload offset and
        chunk size, after ``_chunks`` checked the manifest against this reference."""
        return self._verified_reader(session)[0]

    def _verified_reader(self, session: ReadSession
                         ) -> tuple[tuple[bytes, str, int, int], ChunkReader]:
        """``_checked``'s answer and the ``ChunkReader`` that reads through ``session`` with
        it: found once per session (a reference never changes, nor does a publication, so
        the answer would be the same every time; each read still checks its path and
        opens nothing outside the pool).  Remembered on the reference like its binding
        (not a field: ``using``, pickling and ``from_dict`` make references that check
        again), so that a read of a few rows costs no manifest check and no hex
        decoding."""
        memo = getattr(self, "_checked_memo", None)
        if memo is not None and memo[0] is session:
            return memo[1]
        chunks, path, origin, chunk_bytes = self._chunks(session)
        where = (bytes.fromhex(chunks), path, origin, chunk_bytes)
        found = (where, ChunkReader(session, where, self.nbytes, self.name))
        object.__setattr__(self, "_checked_memo", (session, found))
        return found

    def _materialise(self, row0: int, rows: int | None, *, pin_memory: bool, out: Any,
                     framework: str | None) -> Any:
        # The reference is checked against its authenticated manifest (shape, dtype and
        # record length agree, so the size below is the real payload's) before anything
        # is allocated: an edited shape must not allocate terabytes.
        session = self._session()
        where, reader = self._verified_reader(session)
        if rows is None:
            shape, start, stop = self.shape, 0, self.nbytes
        else:
            row = math.prod(self.shape[1:]) * self.itemsize
            shape, start, stop = (rows, *self.shape[1:]), row0 * row, (row0 + rows) * row
        began = session.clock.now() if tracing.enabled() else None
        if out is not None:
            result, view = out, out_view(self.dtype, out, shape)
        else:
            result, view = allocate(self.dtype, self.itemsize, shape, want_torch(framework),
                                    pin_memory)
        reader.read_into(start, stop, view)
        if began is not None:  # straw-queue's load and slices trace as a read_range
            tracing.emit("read_range", root=session.root, size=stop - start,
                         checked_bytes=checked_span(self.nbytes, start, stop, where[3]),
                         seconds=session.clock.now() - began)
        return result

    def load(self, *, pin_memory: bool = False, out: Any = None,
             framework: str | None = None, reader: Any = None) -> Any:
        """The whole tensor, every chunk verified (see ``straw.tensors.ref`` for the type
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
            raise TypeError(f"tensor {self.name!r}: row slices must be contiguous (step 1), "
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

    # --- checks (straw-queue's) --------------------------------------------------------
    def validate(self) -> None:
        """Check the reference against its published record (dtype, shape, byte length,
        codec, the record's manifest) without reading the payload: ``TensorMismatch``,
        ``InvalidReference`` or ``CorruptData`` otherwise."""
        self._checked(self._session())

    def _bytes(self, start: int, stop: int, *, reader: Any = None) -> bytes:
        """Payload bytes [start, stop), every chunk touched verified, after the reference
        is checked (straw-queue's internal byte read, kept for its callers)."""
        ref = self if reader is None else self.using(reader)
        session = ref._session()
        chunk_reader = ref._verified_reader(session)[1]
        if not (isinstance(start, int) and isinstance(stop, int)
                and 0 <= start <= stop <= self.nbytes):
            raise ValueError(f"tensor {self.name!r}: byte range [{start}, {stop}) is not "
                             f"within its {self.nbytes} bytes")
        out = bytearray(stop - start)
        chunk_reader.read_into(start, stop, memoryview(out))
        return bytes(out)

    def link(self, path: Any) -> TensorRef:
        """This reference (straw-queue's call, kept for its callers): a packed tensor is
        shared through owners and dependencies (``share``), never through a link in the
        filesystem, so nothing is created at ``path``."""
        del path
        return self

    # --- sharing and new versions -------------------------------------------------------
    def share(self, store: Any = None, *, submission_id: str | None = None
              ) -> tuple[RecordSetRef, int]:
        """``(publication, ordinal)``: the descriptor another publication or queue reuses
        (as a dependency) without copying bytes.  A tensor of a publication returns that
        publication and its position there; writes nothing.  A reference without one
        (``from_record`` without ``blob_set``) is wrapped in a new record set, which needs
        ``store`` and ``submission_id``.  ``store`` must be of the tensor's pool and run
        (``InvalidReference`` at once, naming both)."""
        if store is not None:
            self._check_reader(store)
        pub = self.blob_set
        if pub is not None:
            if pub.manifest.segment == self.record.segment:
                return pub, self.record.ordinal  # its own extent: the ordinals agree
            # a record set naming records of other extents: its position there (checked:
            # an earlier straw's reference does not carry it)
            refs = self._session().checked_manifest(pub).record_refs
            if not (0 <= self.blob_ordinal < len(refs)
                    and refs[self.blob_ordinal] == self.record):
                if self.record not in refs:
                    raise InvalidReference(f"tensor {self.name!r} is not a member of its "
                                           f"blob_set {pub!r} (an edited reference)")
                return pub, refs.index(self.record)
            return pub, self.blob_ordinal
        if store is None or submission_id is None:
            raise InvalidReference(
                f"tensor {self.name!r} names no publication; share(store, "
                "submission_id=...) wraps its record in a new record set")
        return store.record_set([self.record], submission_id=submission_id), 0

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
        records = tensor_records({self.kind or "tensor": new}, submission_id,
                                 _granularity(None))
        return published(store, records, submission_id=submission_id, dependencies=())[0]

    # --- restoring ----------------------------------------------------------------------
    @classmethod
    def from_record_set_many(cls, store: Any, reference: RecordSetRef, *,
                             validated: bool = False, reader: Any = None
                             ) -> dict[int, TensorRef]:
        """Every tensor of a publication by ordinal (other records are left out), bound to
        ``store``; reads only the manifest (through ``reader``, a read session of the same
        pool and run, when given)."""
        session = _session_of(store if reader is None else reader)
        if reader is not None:
            _check_same_pool(store, reader)
        manifest = session.checked_manifest(reference)
        return {i: _from_parts(rref, info, store, reference, i,
                               validated=validated)._bound(store)
                for i, (info, rref) in enumerate(zip(manifest.records, manifest.record_refs,
                                                     strict=True))
                if info.codec == CODEC}

    @classmethod
    def from_record_set(cls, store: Any, reference: RecordSetRef, ordinal: int = 0, *,
                        validated: bool = False, reader: Any = None) -> TensorRef:
        """The tensor at ``ordinal`` of a publication."""
        count = _session_of(store if reader is None else reader).checked_manifest(
            reference).records
        if type(ordinal) is not int or not 0 <= ordinal < len(count):
            raise InvalidReference(f"ordinal {ordinal!r} is outside publication {reference!r} "
                                   f"of {len(count)} records")
        tensors = cls.from_record_set_many(store, reference, validated=validated,
                                           reader=reader)
        if ordinal not in tensors:
            raise UnsupportedSchema(f"record {ordinal} of {reference!r} is not a {CODEC} "
                                    "record")
        return tensors[ordinal]

    @classmethod
    def from_record(cls, store: Any, reference: RecordRef, *,
                    blob_set: RecordSetRef | None = None, ordinal: int = 0,
                    validated: bool = False) -> TensorRef:
        """The tensor of one record (``blob_set``/``ordinal``: the publication it is
        member ``ordinal`` of, if known, for ``share``)."""
        if not isinstance(reference, RecordRef):
            raise TypeError(f"reference must be a RecordRef, got {type(reference).__name__}")
        info = _session_of(store).payload_location(reference)[0]
        if info.codec != CODEC:
            raise UnsupportedSchema(f"record {info.record_id!r} has codec {info.codec!r}, "
                                    f"not {CODEC}")
        return _from_parts(reference, info, store, blob_set, ordinal,
                           validated=validated)._bound(store)


def _unpickle(state: tuple[Any, ...]) -> TensorRef:
    """A reference from ``TensorRef._state`` (its publication's manifest segment restored
    from the record's when it was left out)."""
    fields = list(state)
    rref, pub = fields[9], fields[12]
    if isinstance(pub, tuple):
        seg = rref.segment
        fields[12] = RecordSetRef(RecordRef(seg, pub[0]), *pub[1:])
    if fields[8] is None:
        fields[8] = _DEFAULT_CODECS
    return TensorRef(*fields)


# A pickle names its reconstructor by module path: ``straw.tensor``, the path callers
# import, which re-exports this function, so that references pickled by this straw and
# by an earlier one load in either (Ray workers of two versions, stored pickles).
_unpickle.__module__ = "straw.tensor"
