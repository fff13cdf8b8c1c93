"""Debug archives: one rollout's samples kept, indexed and retained (issue 16).

``RolloutArchive.save(path, samples, rollout_id=7)`` keeps a rollout for debugging (look a
sample up by key, replay a training step without generation) and writes one immutable
index, ``<name>.straw.json``, next to the data it names::

    RolloutArchive.save("/shared/debug/rollout_7.straw.json", samples, rollout_id=7,
                        store=store)          # store: the job's pool (tensors shared)
    with RolloutArchive("/shared/debug/rollout_7.straw.json") as archive:
        archive.keys()                        # [(sample key, task key or None), ...]
        archive.load_samples(sample_key="sample:42")
        archive.load_samples(task_key="prompt:21")
        archive.export_pt("/shared/debug/rollout_7.pt")  # self-contained, torch
        archive.release()                     # the archive's retention, not the index
    RolloutArchive.import_pt("/shared/debug/rollout_7.pt",
                             "/shared/debug/imported_7.straw.json")  # adjacent pool

Layout.  The samples are packed ``CHUNK_SAMPLES`` to a publication (a *chunk*: record 0 a
``sample.v1`` structure of plain sample values, the core's sample codec, then the chunk's
own capture tensors), all chunks and one *manifest* publication depending on every chunk
written in one ``publish_many`` (one durable write; a rollout whose chunks hold more than
``WRITE_BATCH_BYTES`` of copied captures is written in several, so memory stays bounded).
A capture that is already a ``TensorRef`` of the store's pool and run is shared, never
copied: its publication becomes a dependency of the chunk and the chunk stores only
``[dependency index, ordinal]`` (a few bytes; the reference's own dict is a kilobyte).
A ``TensorRef`` of another pool or run is loaded and copied in: an archive never depends
on a pool other than its own.  Without a store, ``save`` creates (or reuses) the pool
``straw-data`` next to the index, run ``debug-rollout``.

Retention.  The owner ``archive:<rollout key>:<uuid>`` retains the manifest (and so,
transitively, every chunk and shared tensor): the data survives queue consumption and
garbage collection until ``release()``.  Other owners of the same tensors (the queue,
another archive) keep theirs.  The owner is retained only once the index naming it is
durable; until then a hold of the saving store's writer keeps the data (``store.hold``).
So every archive owner has an index, and a save killed part-way leaves only a hold that
goes with its dead writer at the next collection (and, if the kill fell after the index
was written, an index whose owner retains nothing: opening it says so).

The index (JSON) names ``format``/``version``, the rollout (``rollout_id``, an int, and
``evaluation``: the key ``eval_<id>`` of an evaluation rollout), the pool (``root``,
``pool_id``, ``run_id``), the ``manifest`` reference, its ``storage_owner``, the ``chunks``
references and per sample its ``sample_key`` (``sample:<index>``, or ``position:<ordinal>``
for a sample without an index: its position in the saved list), ``task_key`` (the queue
task the sample came from, ``Sample.metadata["task_id"]``; None without queue provenance),
``group_index`` (the sample's, or None), ``chunk`` and ``ordinal``; and a ``checksum``
(SHA-256 of the canonical JSON of the rest): a truncated or edited index is
``CorruptData``.  The index is created exclusively: saving over an existing path is
``FileExistsError`` before anything is written.

Opening checks the index, that its pool exists (it never creates one: ``FileNotFoundError``)
and is the one named (pool id and run; ``InvalidReference`` otherwise), and that the
manifest's dependencies are the chunks listed.  An index saved with an adjacent pool
finds it beside itself when both were moved or copied together (same pool id).
``load_samples`` reads only the chunks holding the wanted samples (``chunks_read`` counts
them); their captures come back lazy (``TensorRef``s bound to the archive's store).
``entries()`` says where every sample lies (``Entry``: keys, group index, chunk
publication, ordinal), from the index alone: what ``straw.rollout.replay`` selects from.

``.pt`` dumps.  ``export_pt(path)`` writes a self-contained torch dump (tensors
materialised: readable after ``release()`` and collection); ``import_pt(pt_path, path)``
makes a dump an indexed archive (``save``'s pool rules), loading it with ``weights_only``
and checking it whole before anything is written.  Both delegate to
``straw.rollout.archive_pt``, the one module of this layer allowed torch (imported in its
functions only): this module stays NumPy-only.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import uuid
from collections.abc import Iterable
from typing import Any, NamedTuple

from straw.errors import CorruptData, InvalidReference, StrawError, UnsupportedSchema, storage_error
from straw.fs import Filesystem, PosixFS
from straw.refs import Publication, Record, RecordSetRef
from straw.store import SharedFilesystemStore

from .archive_chunks import CHUNK_SCHEMA as CHUNK_SCHEMA
from .archive_chunks import CHUNK_VERSION as CHUNK_VERSION
from .archive_chunks import Chunk as Chunk
from .archive_chunks import _ChunkEncoder
from .archive_chunks import chunk_sample as chunk_sample
from .archive_chunks import read_chunk as read_chunk
from .samples import Sample

log = logging.getLogger("straw")

FORMAT = "straw.rollout-archive"
VERSION = 1
CHUNK_SAMPLES = 64  # samples per chunk: one lookup reads one chunk of at most this many
WRITE_BATCH_BYTES = 256 * 1024**2  # chunks written together, up to this many payload bytes
SUFFIX = ".straw.json"
ADJACENT_POOL = "straw-data"  # the pool created next to an index saved without a store
ADJACENT_RUN = "debug-rollout"
TASK_KEY = "task_id"  # the Sample.metadata entry naming the queue task a sample came from
_SAMPLE_KEY = re.compile(r"(sample|position):(0|[1-9][0-9]*)\Z")
_EVAL = re.compile(r"eval_(0|[1-9][0-9]*)\Z")
_ENTRY_KEYS = frozenset({"sample_key", "task_key", "group_index", "chunk", "ordinal"})
_INDEX_KEYS = frozenset({"format", "version", "rollout_id", "evaluation", "root", "pool_id",
                         "run_id", "manifest", "storage_owner", "chunks", "samples", "checksum"})


def _rollout(rollout_id: object) -> tuple[int, bool]:
    """``(id, evaluation)`` from an int id or an evaluation key ``eval_<id>``."""
    if isinstance(rollout_id, int) and not isinstance(rollout_id, bool) and rollout_id >= 0:
        return rollout_id, False
    if isinstance(rollout_id, str):
        m = _EVAL.match(rollout_id)
        if m:
            return int(m.group(1)), True
    raise ValueError(f"rollout_id {rollout_id!r} is neither a rollout id (an int >= 0) nor "
                     "an evaluation rollout's key 'eval_<id>'")


def _rollout_key(rollout_id: int, evaluation: bool) -> str:
    return f"eval_{rollout_id}" if evaluation else str(rollout_id)


def _index_path(path: object) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"an archive path must be a str or a path, got {type(path).__name__}")
    p = os.path.abspath(os.fspath(path))
    if not p.endswith(SUFFIX) or len(os.path.basename(p)) == len(SUFFIX):
        raise ValueError(f"archive index {p} must be named <name>{SUFFIX}")
    return p


OWNER_PREFIX = "archive:"  # every archive's owner: archive:<rollout key>:<uuid>


def _checksum(body: dict[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON (an index holds finite numbers only)")


def sample_key(sample: Sample, ordinal: int) -> str:
    """``sample:<index>``, or ``position:<ordinal>`` for a sample without an index."""
    return f"position:{ordinal}" if sample.index is None else f"sample:{sample.index}"


def task_key(sample: Sample) -> str | None:
    """The queue task a sample came from (``metadata["task_id"]``), None without one."""
    t = sample.metadata.get(TASK_KEY)
    return t if isinstance(t, str) and t else None


def _check_sample_key(key: object) -> str:
    if not isinstance(key, str):
        raise TypeError(f"sample_key must be a str, got {type(key).__name__}")
    if not _SAMPLE_KEY.match(key):
        raise ValueError(f"sample_key {key!r} is not 'sample:<index>' or "
                         "'position:<ordinal>' (see RolloutArchive.keys())")
    return key


def _check_task_key(key: object) -> str:
    if not isinstance(key, str):
        raise TypeError(f"task_key must be a str, got {type(key).__name__}")
    if not key:
        raise ValueError("task_key must be a non-empty queue task id (e.g. 'prompt:21')")
    return key


class Entry(NamedTuple):
    """Where one archived sample lies: its keys, its group index (None without one), the
    chunk publication holding it (and that chunk's number in the index) and its ordinal
    in the chunk.  What ``straw.rollout.replay`` selects from, without reading data."""

    sample_key: str
    task_key: str | None
    group_index: int | None
    chunk_ref: RecordSetRef
    chunk: int
    ordinal: int


class RolloutArchive:
    """An archive's index opened for lookups (see the module docstring).  ``store``: a
    store of the archive's pool and run to read through (else one is opened at the
    index's ``root``); ``fs``: the filesystem the index is read with (the store's when
    given)."""

    # --- saving ------------------------------------------------------------------------
    @classmethod
    def save(cls, path: str | os.PathLike[str], samples: Iterable[Sample], *,
             rollout_id: int | str, store: SharedFilesystemStore | None = None,
             fs: Filesystem | None = None) -> str:
        """Archive ``samples`` at ``path`` (``<name>.straw.json``); returns the index's
        absolute path.  ``rollout_id``: the rollout's id, or ``eval_<id>`` for an
        evaluation rollout.  ``store``: the job's pool (shared tensors are not copied);
        without it the pool ``straw-data`` next to the index is used (created if missing,
        run ``debug-rollout``)."""
        index_path = _index_path(path)
        rid, evaluation = _rollout(rollout_id)
        if isinstance(samples, (str, bytes, Sample)):
            raise TypeError("samples must be a list of straw.rollout.Sample")
        samples = list(samples)
        for i, s in enumerate(samples):
            if not isinstance(s, Sample):
                raise TypeError(f"samples[{i}] must be a straw.rollout.Sample, got "
                                f"{type(s).__name__}")
        if store is not None and not isinstance(store, SharedFilesystemStore):
            raise TypeError(f"store must be a SharedFilesystemStore, got {type(store).__name__}")
        fs = store.fs if store is not None else (fs or PosixFS())
        # refused before anything is written; the exclusive create below closes the race
        if fs.probe(index_path):
            raise FileExistsError(f"{index_path} exists: rollout archives are immutable; "
                                  "choose a new path")
        own = store is None
        if store is None:
            store = SharedFilesystemStore(os.path.join(os.path.dirname(index_path),
                                                   ADJACENT_POOL), ADJACENT_RUN, fs=fs)
        try:
            return cls._save(index_path, samples, rid, evaluation, store, fs)
        finally:
            if own:
                store.close()

    @classmethod
    def _save(cls, index_path: str, samples: list[Sample], rid: int, evaluation: bool,
              store: SharedFilesystemStore, fs: Filesystem) -> str:
        key = _rollout_key(rid, evaluation)
        token = uuid.uuid4().hex
        submission = f"{OWNER_PREFIX}{key}:{token}"
        published: list[RecordSetRef] = []  # chunks written already (a large rollout)
        pending: list[Publication] = []
        pending_bytes = 0
        entries: list[dict[str, Any]] = []
        try:
            for c, start in enumerate(range(0, len(samples), CHUNK_SAMPLES)):
                chunk = samples[start:start + CHUNK_SAMPLES]
                pub = _ChunkEncoder(store, f"{submission}:{c}").publication(chunk)
                entries += [{"sample_key": sample_key(s, start + j), "task_key": task_key(s),
                             "group_index": s.group_index, "chunk": c, "ordinal": j}
                            for j, s in enumerate(chunk)]
                pending.append(pub)
                pending_bytes += sum(_nbytes(r.payload) for r in pub.records)
                if pending_bytes >= WRITE_BATCH_BYTES:
                    # copied captures (another pool's, loaded) are held until written:
                    # write them in batches so memory stays bounded, not the whole rollout
                    published += store.publish_many(
                        pending, submission_id=f"{submission}:w{len(published)}")
                    pending, pending_bytes = [], 0
            head = json.dumps({"format": FORMAT, "version": VERSION, "rollout_id": rid,
                               "evaluation": evaluation, "samples": len(samples),
                               "chunks": len(published) + len(pending)}).encode()
            pending.append(Publication([Record("archive", head, "json.v1")],
                                       (*published, *range(len(pending)))))
            refs = [*published, *store.publish_many(pending, submission_id=submission)]
        except BaseException:
            if published:  # unreferenced: let the collector have them
                store.release_publications(published)
            raise
        chunks, manifest = refs[:-1], refs[-1]
        owner = submission  # archive:<rollout key>:<uuid>
        # Until the index names the owner, the data lives under a hold of this store's
        # writer: a save killed before its index leaves nothing retained for ever (the
        # hold goes with the dead writer at the next collection).  The owner is retained
        # only once the index is durable, so every archive owner has an index.
        try:
            store.hold(submission, [manifest])
        except BaseException:
            store.release_publications(refs)  # unnamed: let the collector have them
            raise
        indexed = False
        try:
            store.release_publications(refs)  # held from here on
            body: dict[str, Any] = {
                "format": FORMAT, "version": VERSION, "rollout_id": rid,
                "evaluation": evaluation, "root": store.root, "pool_id": store.pool_id,
                "run_id": store.run_id, "manifest": manifest.to_dict(),
                "storage_owner": owner, "chunks": [r.to_dict() for r in chunks],
                "samples": entries}
            body["checksum"] = _checksum(body)
            data = json.dumps(body, sort_keys=True, separators=(",", ":")).encode() + b"\n"
            _write_exclusive(fs, index_path, data)
            indexed = True
            store.retain(owner, [manifest])
        except BaseException:
            if indexed:  # an index whose owner retains nothing would name lost data
                _unlink_quietly(fs, index_path)
            raise
        finally:
            try:
                store.release_hold(submission)
            except (StrawError, OSError) as e:  # it goes with this writer's close
                log.warning("straw: cannot drop the hold of archive %s: %s", index_path, e)
        return index_path

    # --- opening -----------------------------------------------------------------------
    def __init__(self, path: str | os.PathLike[str], *,
                 store: SharedFilesystemStore | None = None, fs: Filesystem | None = None) -> None:
        self.path = _index_path(path)
        if store is not None and not isinstance(store, SharedFilesystemStore):
            raise TypeError(f"store must be a SharedFilesystemStore, got {type(store).__name__}")
        self._fs = store.fs if store is not None else (fs or PosixFS())
        index = self._read_index()
        self.rollout_id: int = index["rollout_id"]
        self.evaluation: bool = index["evaluation"]
        self.root: str = index["root"]
        self.run_id: str = index["run_id"]
        self.pool_id: str | None = index["pool_id"]
        self.storage_owner: str = index["storage_owner"]
        self.manifest_ref = self._ref(index["manifest"], "manifest")
        self._chunks = [self._ref(c, f"chunks[{i}]") for i, c in enumerate(index["chunks"])]
        self._entries = self._check_entries(index["samples"])
        self._own = store is None
        try:
            self._store = self._open_store(store)
        except ValueError as e:  # a root the OS cannot name (a NUL, a lone surrogate)
            raise self._bad(f"its pool {self.root!r} cannot be opened ({e})") from None
        try:
            self._check_manifest()
        except BaseException:
            self.close()
            raise
        self.chunks_read = 0  # chunks decoded by load_samples (a lookup reads only its own)
        self.closed = False

    @property
    def key(self) -> str:
        """The rollout's key: its id, or ``eval_<id>`` for an evaluation rollout."""
        return _rollout_key(self.rollout_id, self.evaluation)

    def _bad(self, why: str) -> CorruptData:
        return CorruptData(f"archive index {self.path}: {why}; the index is damaged or was "
                           "edited (indexes are immutable: save the rollout again)")

    def _read_index(self) -> dict[str, Any]:
        try:
            raw = self._fs.read_file(self.path)
        except FileNotFoundError:
            raise FileNotFoundError(f"no rollout archive index at {self.path}") from None
        try:  # no NaN or Infinity (straw writes none); RecursionError: nested too deep
            index = json.loads(raw, parse_constant=_no_constant)
            checksum = isinstance(index, dict) and _checksum(
                {k: v for k, v in index.items() if k != "checksum"})
        except (ValueError, RecursionError) as e:  # (a UnicodeDecodeError is a ValueError)
            raise self._bad(f"it is not complete JSON (truncated?): {e}") from None
        if not isinstance(index, dict):
            raise self._bad("it is not a JSON object")
        if index.get("format") != FORMAT or index.get("version") != VERSION:
            raise UnsupportedSchema(f"{self.path} is not a {FORMAT} version {VERSION} index "
                                    f"(format {index.get('format')!r}, version "
                                    f"{index.get('version')!r})")
        if set(index) != _INDEX_KEYS:
            raise self._bad(f"its fields are {sorted(index)}")
        if index["checksum"] != checksum:
            raise self._bad("its checksum does not match its content")
        kinds = {"rollout_id": int, "evaluation": bool, "root": str, "run_id": str,
                 "storage_owner": str, "manifest": dict, "chunks": list, "samples": list}
        for name, kind in kinds.items():
            if not isinstance(index[name], kind) or (kind is int
                                                     and isinstance(index[name], bool)):
                raise self._bad(f"{name} is a {type(index[name]).__name__}")
        if index["pool_id"] is not None and not isinstance(index["pool_id"], str):
            raise self._bad("pool_id is not a str")
        if not index["storage_owner"].startswith(OWNER_PREFIX):
            raise self._bad(f"storage_owner {index['storage_owner']!r} is not an archive's "
                            f"owner ({OWNER_PREFIX}...)")
        return index

    def _ref(self, value: Any, where: str) -> RecordSetRef:
        try:
            ref = RecordSetRef.from_dict(value)
        except (InvalidReference, KeyError, TypeError, ValueError) as e:
            raise self._bad(f"{where} is not a publication reference ({e})") from None
        if ref.manifest.segment.run_id != self.run_id:
            raise self._bad(f"{where} belongs to run {ref.manifest.segment.run_id!r}, the "
                            f"archive to run {self.run_id!r}")
        return ref

    def _check_entries(self, samples: list[Any]) -> list[Entry]:
        out = []
        for i, e in enumerate(samples):
            ok = (isinstance(e, dict) and set(e) == _ENTRY_KEYS
                  and isinstance(e["sample_key"], str) and _SAMPLE_KEY.match(e["sample_key"])
                  and (e["task_key"] is None or isinstance(e["task_key"], str))
                  and (e["group_index"] is None
                       or (type(e["group_index"]) is int and e["group_index"] >= 0))
                  and type(e["chunk"]) is int and 0 <= e["chunk"] < len(self._chunks)
                  and type(e["ordinal"]) is int and 0 <= e["ordinal"] < CHUNK_SAMPLES)
            if not ok:
                raise self._bad(f"samples[{i}] is not a sample entry")
            out.append(Entry(e["sample_key"], e["task_key"], e["group_index"],
                             self._chunks[e["chunk"]], e["chunk"], e["ordinal"]))
        return out

    def _open_store(self, store: SharedFilesystemStore | None) -> SharedFilesystemStore:
        if store is not None:
            if (os.path.realpath(store.root) != os.path.realpath(self.root)
                    or store.run_id != self.run_id
                    or (self.pool_id is not None and store.pool_id != self.pool_id)):
                raise InvalidReference(
                    f"archive {self.path} belongs to run {self.run_id!r} of pool "
                    f"{self.pool_id} at {self.root}; the store given is run "
                    f"{store.run_id!r} of pool {store.pool_id} at {store.root}: open it "
                    "with a store of its own pool and run")
            return store
        root = self.root
        beside = os.path.join(os.path.dirname(self.path), ADJACENT_POOL)
        if (not self._fs.probe(os.path.join(root, "POOL"))
                and os.path.basename(root) == ADJACENT_POOL and self.run_id == ADJACENT_RUN
                and self._fs.probe(os.path.join(beside, "POOL"))):
            # an adjacent pool moved (or copied) with its index: it is the one beside the
            # index now (its pool id is checked below like any other)
            root = beside
        # never create a pool: an index whose pool is gone must say so, not open an empty one
        if not self._fs.probe(os.path.join(root, "POOL")):
            raise FileNotFoundError(f"archive {self.path}: its pool {self.root} is missing "
                                    "(copying the index alone does not copy its data)")
        opened = SharedFilesystemStore(root, self.run_id, fs=self._fs)
        if self.pool_id is not None and opened.pool_id != self.pool_id:
            opened.close()
            raise InvalidReference(f"archive {self.path} belongs to pool {self.pool_id}; "
                                   f"{root} now holds pool {opened.pool_id}")
        return opened

    def _check_manifest(self) -> None:
        """The manifest exists and depends on exactly the chunks the index lists."""
        try:
            deps = self._store.checked_manifest(self.manifest_ref).dependencies
        except InvalidReference as e:
            raise InvalidReference(
                f"archive {self.path}: its manifest cannot be read ({e}); its data was "
                "released and collected (or its save was killed before retaining it), or "
                "the index names another pool's data") from None
        if list(deps) != self._chunks:
            raise self._bad("its chunks are not the manifest's")

    # --- lookups -----------------------------------------------------------------------
    def _check(self) -> None:
        if self.closed:
            raise ValueError(f"archive {self.path} is closed")

    def keys(self) -> list[tuple[str, str | None]]:
        """``(sample key, task key or None)`` of every sample, in archive order
        (duplicates kept: compact trajectories may share a sample index)."""
        self._check()
        return [(e.sample_key, e.task_key) for e in self._entries]

    def entries(self) -> list[Entry]:
        """Where every sample lies (``Entry``), in archive order: what a replay selects
        from (``straw.rollout.replay``), read from the index alone."""
        self._check()
        return list(self._entries)

    @property
    def pool_root(self) -> str:
        """The root of the pool this archive reads (the index's, or the adjacent pool's
        new place when both were moved together)."""
        return self._store.root

    def __len__(self) -> int:
        return len(self._entries)

    def load_samples(self, sample_key: str | None = None, task_key: str | None = None
                     ) -> list[Sample]:
        """The samples with ``sample_key`` and/or ``task_key`` (both: those matching both;
        neither: all), in archive order; ``KeyError`` when none matches.  Reads only the
        chunks holding them; captures come back as lazy ``TensorRef``s."""
        self._check()
        if sample_key is not None:
            _check_sample_key(sample_key)
        if task_key is not None:
            _check_task_key(task_key)
        wanted = [(e.chunk, e.ordinal) for e in self._entries
                  if (sample_key is None or e.sample_key == sample_key)
                  and (task_key is None or e.task_key == task_key)]
        if not wanted:
            raise KeyError((sample_key, task_key))
        decoded: dict[int, Chunk] = {}
        out = []
        for c, o in wanted:
            where = f"archive {self.path}: chunk {c}"
            if c not in decoded:
                decoded[c] = read_chunk(self._store, self._chunks[c], where)
                self.chunks_read += 1
            out.append(chunk_sample(self._store, decoded[c], o, where))
        return out

    # --- .pt dumps: straw.rollout.archive_pt, the one module of the layer using torch ---
    def export_pt(self, path: str | os.PathLike[str]) -> str:
        """Write every sample to ``path`` (a new file) as a self-contained torch dump, its
        tensors materialised: it stays readable after ``release()`` and collection.
        Returns its absolute path (``straw.rollout.archive_pt.export_pt``)."""
        self._check()
        from .archive_pt import export_pt  # torch, lazily: import straw.rollout loads none
        return export_pt(self, path, fs=self._fs)

    @classmethod
    def import_pt(cls, pt_path: str | os.PathLike[str], path: str | os.PathLike[str], *,
                  rollout_id: int | str | None = None,
                  store: SharedFilesystemStore | None = None, fs: Filesystem | None = None) -> str:
        """Make the ``.pt`` dump at ``pt_path`` an indexed archive at ``path`` (``save``'s
        pool rules: without ``store``, the adjacent ``straw-data`` pool).  ``rollout_id``:
        the dump's own unless given.  The dump is loaded with ``weights_only`` and checked
        whole before anything is written (``straw.rollout.archive_pt.load_pt``)."""
        index_path = _index_path(path)
        rfs = store.fs if store is not None else (fs or PosixFS())
        if rfs.probe(index_path):  # before the dump is even read
            raise FileExistsError(f"{index_path} exists: rollout archives are immutable; "
                                  "choose a new path")
        from .archive_pt import load_pt
        dump = load_pt(pt_path, fs=rfs)
        rid = dump.rollout_key if rollout_id is None else rollout_id
        return cls.save(index_path, dump.samples, rollout_id=rid, store=store, fs=fs)

    # --- ending ------------------------------------------------------------------------
    def release(self) -> bool:
        """Drop the archive's retention (the index stays, for inspection; other owners of
        the same data keep theirs).  False if it was released already.  The owner the
        index names is released only if it retains exactly this archive's manifest
        (``OwnerMismatch`` otherwise, nothing released): the index's checksum is no
        signature, and an index edited to name a checkpoint's or another archive's owner
        must not release that owner's data."""
        self._check()
        return self._store.release(self.storage_owner, only_if=[self.manifest_ref])

    def close(self) -> None:
        """Close the reader (the store this archive opened); the data stays retained."""
        if self._own and not getattr(self, "closed", False):
            self._store.close()
        self.closed = True

    def __enter__(self) -> RolloutArchive:
        self._check()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"RolloutArchive({self.path!r}, rollout {self.key}, {len(self._entries)} "
                f"samples in {len(self._chunks)} chunks)")


def _nbytes(payload: Any) -> int:
    n = getattr(payload, "nbytes", None)
    return int(n) if n is not None else len(payload)


def _unlink_quietly(fs: Filesystem, path: str) -> None:
    try:
        fs.unlink(path)
    except OSError as e:  # the caller's error is the one to raise
        log.warning("straw: cannot remove the unretained archive index %s: %s", path, e)


def _write_exclusive(fs: Filesystem, path: str, data: bytes) -> None:
    """Create ``path`` (never replacing a file: ``FileExistsError``), write and sync it and
    its name.  A crash mid-write leaves a short file, which its checksum refuses."""
    try:
        fs.makedirs_durable(os.path.dirname(path))
    except OSError as e:
        raise storage_error(e, f"cannot create the directory of {path}") from e
    fd = fs.open(path, write=True, create=True, exclusive=True)
    try:
        try:
            fs.writev(fd, [data], 0)
            fs.fsync(fd)
        finally:
            fs.close(fd)
        fs.fsync_dir(os.path.dirname(path))
    except BaseException as e:
        fs.unlink(path)  # ours, incomplete: no reader may take it for an archive
        if isinstance(e, OSError):
            raise storage_error(e, f"cannot write archive index {path}") from e
        raise


__all__ = ["RolloutArchive", "Entry", "Chunk", "read_chunk", "chunk_sample", "FORMAT", "VERSION",
           "CHUNK_SAMPLES", "ADJACENT_POOL", "ADJACENT_RUN", "TASK_KEY", "sample_key", "task_key"]
