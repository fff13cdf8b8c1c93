"""A replayed group: one accepted group whose samples are archived samples, by reference.

The batch builder's backlog holds one publication per group (``Accepted.ref``, read with
``builder.lazy_group``), but a debug archive packs its samples 64 to a chunk
(``straw.rollout.archive``): a group is a few samples of one or two chunks.  A replay
(``straw.rollout.replay.replay_archives``) therefore publishes, per group, one tiny
record naming its samples by ``[chunk, ordinal]`` and depending on those chunks: a
reference, not a copy (no token id, reward or capture byte is written again; the record
is a few dozen bytes).  Depending on the chunks is what retains them: whoever retains
the group (the replay's branch owner, the replay queue's collections and shards) retains
the archived samples and, through the chunks, the tensors they share with the source
pool, whatever the archive's own owner does (RL7).

Record 0 (``json.v1``, record metadata ``{"schema": REPLAY_GROUP_SCHEMA, "version":
REPLAY_GROUP_VERSION}``) is ``{"environment": str, "samples": [[dependency index,
ordinal], ...]}``; the publication's dependencies are the chunks, in the order the
samples first name them.  ``read_replay_group`` rebuilds the ``SampleGroup``: the
chunks' record 0 only, captures lazy ``TensorRef``s (as for any accepted group).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from straw.errors import CorruptData, UnsupportedSchema
from straw.refs import Publication, Record, RecordSetRef

from .archive_chunks import Chunk, chunk_sample, read_chunk
from .samples import SampleGroup

REPLAY_GROUP_SCHEMA = "straw.rollout.replay-group"
REPLAY_GROUP_VERSION = 1


def replay_group_publication(members: Sequence[tuple[RecordSetRef, int]], *,
                             environment: str, tokens: int) -> Publication:
    """The publication of a group whose samples are ``members`` (``(chunk reference,
    ordinal)`` in group order); ``tokens``: their token count (sizes the reference)."""
    if not members:
        raise ValueError("a replayed group names at least one archived sample")
    deps: list[RecordSetRef] = []
    names = []
    for chunk, ordinal in members:
        if chunk not in deps:
            deps.append(chunk)
        names.append([deps.index(chunk), ordinal])
    body = json.dumps({"environment": environment, "samples": names},
                      separators=(",", ":"), sort_keys=True).encode()
    record = Record("replay-group", body, "json.v1",
                    {"schema": REPLAY_GROUP_SCHEMA, "version": REPLAY_GROUP_VERSION}, tokens)
    return Publication([record], tuple(deps))


def is_replay_group(manifest: Any) -> bool:
    """Whether the publication of ``manifest`` (``store.checked_manifest``) is a replayed
    group (its record 0 says so in its metadata: no payload read)."""
    records = manifest.records
    return bool(records) and records[0].metadata.get("schema") == REPLAY_GROUP_SCHEMA


def read_replay_group(store: Any, ref: RecordSetRef, manifest: Any) -> SampleGroup:
    """The group the replayed-group publication ``ref`` names (module docstring)."""
    where = f"replayed group {ref!r}"
    version = manifest.records[0].metadata.get("version")
    if version != REPLAY_GROUP_VERSION:
        raise UnsupportedSchema(f"{where} is {REPLAY_GROUP_SCHEMA} version {version!r}; this "
                                f"straw reads {REPLAY_GROUP_VERSION}")
    head = store.read_record(manifest.record_refs[0])
    try:
        value = json.loads(bytes(head.payload))
    except ValueError as e:
        raise CorruptData(f"{where} is not valid JSON: {e}") from None
    deps = manifest.dependencies
    names = value.get("samples") if isinstance(value, dict) else None
    env = value.get("environment") if isinstance(value, dict) else None
    if not (isinstance(env, str) and isinstance(names, list) and names
            and all(isinstance(n, list) and len(n) == 2 and type(n[0]) is int
                    and 0 <= n[0] < len(deps) and type(n[1]) is int for n in names)):
        raise CorruptData(f"{where} is not {{environment, samples: [[chunk, ordinal], ...]}}")
    chunks: dict[int, Chunk] = {}
    samples = []
    for d, ordinal in names:
        if d not in chunks:  # each chunk's record 0 read once per group
            chunks[d] = read_chunk(store, deps[d], f"{where}: archive chunk {d}")
        samples.append(chunk_sample(store, chunks[d], ordinal, f"{where}: archive chunk {d}"))
    try:
        return SampleGroup(tuple(samples), env)
    except (TypeError, ValueError) as e:
        raise CorruptData(f"{where} does not make a valid group: {e}") from None


__all__ = ["REPLAY_GROUP_SCHEMA", "REPLAY_GROUP_VERSION", "replay_group_publication",
           "is_replay_group", "read_replay_group"]
