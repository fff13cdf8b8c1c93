"""The backlog's entry, ``Accepted`` (one accepted group: its commit, environment,
scheduling key and token counts), and the backlog's stored form: one list per field
(``backlog_columns``), read back into entries with every reference checked
(``backlog_of_columns``)."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from straw.errors import CorruptData, InvalidReference, UnsupportedSchema
from straw.refs import RecordRef, RecordSetRef, SegmentRef


@dataclass(frozen=True)
class Accepted:
    """One accepted group in the backlog: its commit, where its environment and
    scheduling key put it, and its samples' token counts (for rank balancing).

    ``restored``: the group was accepted by ANOTHER queue and restored into this
    builder's backlog (a checkpoint's exact or salvage restore, ``straw.rollout.isolated``):
    its ``commit_id`` is the source queue's, its ``position`` is its rank in the restored
    order, never a commit position of this queue.  Restored groups are selected first, in
    that order (a salvage replays the dead run's batches identically), and their
    positions are never acknowledged on this queue (they are not its commits)."""

    position: int
    commit_id: str
    ref: RecordSetRef
    environment: str
    key: int
    tokens: tuple[int, ...]
    restored: bool = False

    def to_dict(self) -> dict[str, Any]:
        out = {"position": self.position, "commit_id": self.commit_id,
               "ref": self.ref.to_dict(), "environment": self.environment, "key": self.key,
               "tokens": list(self.tokens)}
        if self.restored:  # only when set: states and plans written before stay the same
            out["restored"] = True
        return out

    @classmethod
    def from_dict(cls, value: Mapping[str, Any]) -> Accepted:
        return cls(int(value["position"]), str(value["commit_id"]),
                   RecordSetRef.from_dict(value["ref"]), str(value["environment"]),
                   int(value["key"]), tuple(map(int, value["tokens"])),
                   bool(value.get("restored", False)))

    def order(self) -> tuple[int, int, int]:
        """Selection order: restored groups first in their restored order, then this
        queue's by oldest weight version (scheduling key), then FIFO."""
        return order(self.restored, self.key, self.position)


def order(restored: bool, key: int, position: int) -> tuple[int, int, int]:
    """``Accepted.order`` of an entry's fields (also of a stored table's rows, sorted
    before any entry is built: ``backlog_of_columns``)."""
    return (0, 0, position) if restored else (1, key, position)



# The consumer-state record (what ``batch_ready``/``save_consumer_state`` name) holds the
# state in its *stored form*: ``state()`` with version STORED_VERSION and the backlog as
# one array per field (``COLUMNS``) instead of one JSON object per group, so that key
# names are not repeated per group and per reference level at every save.
# ``read_stored_state`` reads both forms (a version 2 record holds ``state()`` as it is).
STORED_VERSION = 3
COLUMNS = ("position", "commit_id", "environment", "key", "tokens", "restored",
            "run_id", "path", "segment_id", "size", "checksum", "segment_version",
            "checksum_algorithm", "offset", "ordinal", "digest", "records",
            "payload_bytes", "ref_tokens")


def backlog_columns(backlog: Sequence[Accepted]) -> dict[str, list[Any]]:
    """``backlog`` in the stored form: one list per field of ``COLUMNS`` (also the form
    of a checkpoint's backlog, ``straw.rollout.checkpoint``)."""
    refs = [e.ref for e in backlog]
    segs = [r.manifest.segment for r in refs]
    return {"position": [e.position for e in backlog],
            "commit_id": [e.commit_id for e in backlog],
            "environment": [e.environment for e in backlog],
            "key": [e.key for e in backlog],
            "tokens": [list(e.tokens) for e in backlog],
            "restored": [e.restored for e in backlog],
            "run_id": [s.run_id for s in segs], "path": [s.path for s in segs],
            "segment_id": [s.segment_id for s in segs], "size": [s.size for s in segs],
            "checksum": [s.checksum for s in segs],
            "segment_version": [s.version for s in segs],
            "checksum_algorithm": [s.checksum_algorithm for s in segs],
            "offset": [s.offset for s in segs],
            "ordinal": [r.manifest.ordinal for r in refs],
            "digest": [r.digest for r in refs], "records": [r.records for r in refs],
            "payload_bytes": [r.payload_bytes for r in refs],
            "ref_tokens": [r.tokens for r in refs]}


def backlog_of_columns(value: Any, *, restored_from: int | None = None,
                       leave_out: Collection[str] = ()) -> list[Accepted]:
    """The backlog entries of a stored form's columns, in their order, each reference
    checked as ``RecordSetRef.from_dict`` checks it (``CorruptData`` for a malformed
    table; ``InvalidReference``/``UnsupportedSchema`` for a reference not of ours).

    ``restored_from`` (a restore into another queue, ``straw.rollout.isolated``): instead
    the rows whose commit id is not in ``leave_out``, in selection order
    (``Accepted.order``), as restored entries ranked from ``restored_from`` on, which is
    what ``isolated.restored_backlog`` makes of them (it keeps such entries as they are).
    The rows are sorted on the columns and each entry built once (a restore reads
    backlogs of many thousand groups)."""
    if not isinstance(value, dict) or set(value) != set(COLUMNS):
        got = sorted(value) if isinstance(value, dict) else type(value).__name__
        raise CorruptData(f"the stored builder state's backlog is not a table of the "
                          f"columns {list(COLUMNS)}: got {got}")
    columns = [value[c] for c in COLUMNS]
    if not all(isinstance(c, list) for c in columns) or len({len(c) for c in columns}) > 1:
        raise CorruptData("the stored builder state's backlog columns are not lists of one "
                          "length: the record was edited or damaged")
    (_, _, _, _, _, _, run_id, path, segment_id, size, checksum, version, algorithm, offset,
     ordinal, digest, records, payload_bytes, ref_tokens) = columns
    out = []
    try:
        # the entries' own fields converted column by column (as from_dict converts them)
        position, key = list(map(int, columns[0])), list(map(int, columns[3]))
        commit_id, env = list(map(str, columns[1])), list(map(str, columns[2]))
        tokens = [tuple(map(int, t)) for t in columns[4]]
        restored = list(map(bool, columns[5]))
        rows: Sequence[int] = range(len(position))
        if restored_from is not None:
            skip = set(leave_out)
            rows = sorted((i for i in rows if commit_id[i] not in skip),
                          key=lambda i: order(restored[i], key[i], position[i]))
        for rank, i in enumerate(rows, restored_from or 0):
            ref = RecordSetRef(RecordRef(SegmentRef(
                run_id[i], path[i], segment_id[i], size[i], checksum[i], version[i],
                algorithm[i], offset[i]), ordinal[i]), digest[i], records[i],
                payload_bytes[i], ref_tokens[i])
            ref.check()  # InvalidReference / UnsupportedSchema, as from_dict raises them
            if restored_from is None:
                out.append(Accepted(position[i], commit_id[i], ref, env[i], key[i],
                                    tokens[i], restored[i]))
            else:
                out.append(Accepted(rank, commit_id[i], ref, env[i], key[i], tokens[i],
                                    True))
    except (InvalidReference, UnsupportedSchema):
        raise  # a reference that is not one of ours: refused as everywhere else
    except (TypeError, ValueError) as e:
        raise CorruptData(f"the stored builder state's backlog holds a malformed entry: "
                          f"{e}") from None
    return out



__all__ = ["Accepted", "order", "STORED_VERSION", "COLUMNS", "backlog_columns",
           "backlog_of_columns"]
