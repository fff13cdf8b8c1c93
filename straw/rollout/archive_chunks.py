"""The chunk of a rollout archive (``straw.rollout.archive``): up to ``CHUNK_SAMPLES``
samples in one publication, its record 0 the samples' values, with the captures already
in the archive's pool and run kept as ``[dependency, ordinal]`` pointers instead of
copies.  Reading a chunk decodes record 0 only; a sample's captures stay lazy."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from straw.codec import sample_from_records, sample_records
from straw.errors import CorruptData, UnsupportedSchema
from straw.refs import Publication, RecordSetRef
from straw.store import SharedFilesystemStore
from straw.tensor import TensorRef

from .codec import _CAPTURES, _sample_from_value, _sample_value
from .samples import Sample

CHUNK_SCHEMA = "straw.rollout.archive-chunk"
CHUNK_VERSION = 1


class Chunk(NamedTuple):
    """One decoded chunk: its sample values, its shared captures by sample ordinal
    (``[field, dependency, ordinal]``) and its dependencies (the shared tensors'
    publications)."""

    samples: list[Any]
    shared: dict[int, list[Any]]
    deps: tuple[RecordSetRef, ...]
    # the shared tensors of each dependency read so far (``from_record_set_many``): the
    # samples of one group share one publication, read once for all of them
    tensors: dict[int, Mapping[int, TensorRef]]


def read_chunk(store: SharedFilesystemStore, ref: RecordSetRef, where: str) -> Chunk:
    """The chunk published at ``ref`` (its record 0 only: captures stay lazy).  What
    ``load_samples`` reads, and what a replayed group (``straw.rollout.replay_group``,
    archived samples named by chunk and ordinal) reads its samples from."""
    manifest = store.checked_manifest(ref)
    if not manifest.record_refs:
        raise CorruptData(f"{where} holds no records")
    head = store.read_record(manifest.record_refs[0])
    value = sample_from_records([head], tensors=TensorRef.from_record_set_many(store, ref),
                                lazy_tensors_over=0, store=store)
    if not isinstance(value, dict) or value.get("schema") != CHUNK_SCHEMA:
        raise UnsupportedSchema(f"{where} is not a {CHUNK_SCHEMA}")
    if value.get("version") != CHUNK_VERSION:
        raise UnsupportedSchema(f"{where} is {CHUNK_SCHEMA} version "
                                f"{value.get('version')!r}; this straw reads {CHUNK_VERSION}")
    samples, items = value.get("samples"), value.get("shared")
    if not isinstance(samples, list) or not isinstance(items, list):
        raise CorruptData(f"{where} lacks its samples or shared captures")
    deps = tuple(manifest.dependencies)
    shared: dict[int, list[Any]] = {}
    for item in items:
        if not (isinstance(item, list) and len(item) == 4 and type(item[0]) is int
                and 0 <= item[0] < len(samples) and item[1] in _CAPTURES
                and type(item[2]) is int and 0 <= item[2] < len(deps)
                and type(item[3]) is int and isinstance(samples[item[0]], dict)):
            raise CorruptData(f"{where} holds a malformed shared capture {item!r}")
        shared.setdefault(item[0], []).append(item[1:])
    return Chunk(samples, shared, deps, {})


def chunk_sample(store: SharedFilesystemStore, chunk: Chunk, ordinal: int, where: str
                 ) -> Sample:
    """Sample ``ordinal`` of a decoded chunk, its captures lazy ``TensorRef``s."""
    if type(ordinal) is not int or not 0 <= ordinal < len(chunk.samples):
        raise CorruptData(f"{where} holds {len(chunk.samples)} samples, not sample {ordinal!r}")
    value = chunk.samples[ordinal]
    value = dict(value) if isinstance(value, dict) else value
    # shared captures resolved for the wanted sample only: one manifest read (of the
    # tensor's publication) per publication, none for the rest of the chunk
    for name, d, at in chunk.shared.get(ordinal, ()):
        if d not in chunk.tensors:
            chunk.tensors[d] = TensorRef.from_record_set_many(store, chunk.deps[d])
        if at not in chunk.tensors[d]:
            raise CorruptData(f"{where} sample {ordinal}: its {name} is record {at} of "
                              f"{chunk.deps[d]!r}, which is not a tensor record there")
        value[name] = chunk.tensors[d][at]
    return _sample_from_value(value, f"{where} sample {ordinal}")


class _ChunkEncoder:
    """One chunk's value and dependencies: shared captures become ``[dependency, ordinal]``
    pointers, the others stay values the sample codec stores as the chunk's tensors."""

    def __init__(self, store: SharedFilesystemStore, submission: str) -> None:
        self.store, self.submission = store, submission
        self.deps: list[RecordSetRef] = []
        self.shared: list[list[Any]] = []  # [sample ordinal, field, dependency, ordinal]
        self.wrapped = 0

    def _dependency(self, pub: RecordSetRef) -> int:
        if pub not in self.deps:
            self.deps.append(pub)
        return self.deps.index(pub)

    def capture(self, ordinal: int, name: str, value: Any) -> Any:
        if not isinstance(value, TensorRef):
            return value  # NumPy or torch: stored in the chunk (new data)
        if not value.shares_storage(self.store):
            # another pool or run: copy it in, so the archive depends on its own pool only
            return value.load(framework="numpy")
        if value.blob_set is None:  # a bare record reference: wrap it, still no copy
            self.wrapped += 1
            pub, at = value.share(self.store,
                                  submission_id=f"{self.submission}:wrap:{self.wrapped}")
        else:
            pub, at = value.share(self.store)
        self.shared.append([ordinal, name, self._dependency(pub), at])
        return None

    def publication(self, samples: Sequence[Sample]) -> Publication:
        values = []
        for j, s in enumerate(samples):
            v = _sample_value(s)
            for name in _CAPTURES:
                if v[name] is not None:
                    v[name] = self.capture(j, name, v[name])
            values.append(v)
        value = {"schema": CHUNK_SCHEMA, "version": CHUNK_VERSION, "samples": values,
                 "shared": self.shared}
        records, found = sample_records(value, tokens=sum(len(s.tokens) for s in samples))
        deps = self.deps + [d for d in found if d not in self.deps]
        return Publication(records, tuple(deps))


__all__ = ["Chunk", "read_chunk", "chunk_sample", "CHUNK_SCHEMA", "CHUNK_VERSION"]
