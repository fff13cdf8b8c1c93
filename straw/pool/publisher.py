"""Publication (D1, D7): a store's records laid out as extents of its writer's open pack,
written with one ``writev`` and one data sync per call, their references returned only
after that sync.  Dependencies (and a record set's records) are retained as edges of the
new extent before its bytes are written.  Submission ids are the idempotency ids: a retry
with the same id and content returns the original references (unless collected since),
different content raises ``IdempotencyConflict``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import tracing
from ..errors import IdempotencyConflict, InvalidReference
from . import hold_owners
from .arguments import Normalized, PublicationRules, check_submission_id, check_usage, sequence_of
from .catalog.state import Extent
from .pack import encode_extent
from .parts import StoreParts
from .records import Publication, Record
from .recovery import ref_from_entry
from .refs import RecordRef, RecordSetRef, SegmentRef
from .retention import Retention
from .writer import Submission, WriterIncarnation

PUBLISH_SECONDS_KEPT = 1024
API_CALLS = {"publish": "publish/publish_many", "records": "write_records",
             "record_set": "record_set"}


class Publisher:
    """The publishing calls of one store (their contract is the store's; see there) and
    what it published (``metrics``)."""

    def __init__(self, store: StoreParts, rules: PublicationRules, retention: Retention
                 ) -> None:
        self._store = store
        self._rules = rules
        self._retention = retention
        self.metrics: dict[str, Any] = {"payload_bytes": 0, "records": 0, "segments": 0,
                                        "publish_seconds": []}

    def publish_many(self, publications: Sequence[Publication], *,
                     submission_id: str) -> tuple[RecordSetRef, ...]:
        self._store._check_process()
        check_submission_id(submission_id)
        if isinstance(publications, (str, bytes)) or not isinstance(publications, Sequence):
            raise TypeError("publications must be a list of straw.Publication")
        if not publications:  # straw-queue refuses it too: an extent of nothing
            raise ValueError(f"publish_many([], submission_id={submission_id!r}) has no "
                             "publication to write; pass at least one Publication (an "
                             "empty one publishes an empty record set: publish([]))")
        normalized: list[Normalized] = []
        try:
            for i, p in enumerate(publications):
                normalized.append(self._rules.normalize(
                    p, i, earlier=[n.digest for n in normalized]))
            started = self._store.clock.now() if tracing.enabled() else None
            refs = self._publish(normalized, submission_id, "publish")
        except Exception as e:
            self._retention.hold_dependencies(
                e, "publish", submission_id,
                [d for p in publications if isinstance(p, Publication)
                 for d in sequence_of(p.dependencies)])
            raise
        if started is not None and refs:
            self._trace_write(refs[0].segment, [r for p in publications for r in p.records],
                              started)
        return tuple(refs)

    def _trace_write(self, seg: SegmentRef, records: Sequence[Record], started: float
                     ) -> None:
        """straw-queue's ``write`` trace event (``straw.tracing``): no payload byte."""
        tracing.emit("write", root=self._store.root, size=seg.size, records=records,
                     seconds=self._store.clock.now() - started)

    def write_records(self, records: Sequence[Record], *, submission_id: str
                      ) -> tuple[RecordRef, ...]:
        self._store._check_process()
        check_submission_id(submission_id)
        if isinstance(records, Sequence) and not isinstance(records, (str, bytes)) \
                and not records:  # straw-queue refuses it too: an extent of nothing
            raise ValueError(f"write_records([], submission_id={submission_id!r}) has no "
                             "record to write; pass at least one Record")
        normalized = [self._rules.normalize(Publication(records), 0, "write_records")]
        started = self._store.clock.now() if tracing.enabled() else None
        (ref,) = self._publish(normalized, submission_id, "records")
        if started is not None:
            self._trace_write(ref.segment, records, started)
        return tuple(RecordRef(ref.segment, i) for i in range(ref.records))

    def record_set(self, refs: Sequence[RecordRef], *, submission_id: str,
                   dependencies: Sequence[RecordSetRef] = ()) -> RecordSetRef:
        self._store._check_process()
        check_submission_id(submission_id)
        try:
            return self._record_set(refs, submission_id, dependencies)
        except Exception as e:
            self._retention.hold_dependencies(
                e, "record_set", submission_id, [*sequence_of(refs), *sequence_of(dependencies)])
            raise

    def _record_set(self, refs: Sequence[RecordRef], submission_id: str,
                    dependencies: Sequence[RecordSetRef]) -> RecordSetRef:
        if isinstance(refs, (RecordRef, str, bytes)) or not isinstance(refs, Sequence):
            raise TypeError("refs must be a list of RecordRef")
        members = []
        seen: dict[RecordRef, int] = {}
        for i, r in enumerate(refs):
            if not isinstance(r, RecordRef):
                raise TypeError(f"refs[{i}] must be a RecordRef, got {type(r).__name__}")
            r = self._store._session._canonical(r)
            if r in seen:  # as a publication's record ids must be unique (straw-queue's)
                raise InvalidReference(f"refs[{i}] names the record refs[{seen[r]}] names; "
                                       "a record set names each record once")
            seen[r] = i
            r.check()
            if r.segment.run_id != self._store.run_id:
                raise InvalidReference(f"refs[{i}] belongs to run {r.segment.run_id!r}; "
                                       "records must be in this store's run "
                                       f"{self._store.run_id!r}")
            info, _, _ = self._store._session.payload_location(r)  # it exists and is a record
            members.append((r, info))
        pub = self._rules.normalize(Publication((), tuple(dependencies)), 0, "record_set",
                                    members=members)
        return self._publish([pub], submission_id, "record_set")[0]

    def _publish(self, normalized: list[Normalized], submission_id: str, api: str
                 ) -> list[RecordSetRef]:
        digests = tuple(n.digest for n in normalized)
        started = self._store.clock.now()
        with self._store._write_lock:
            self._store._check_open()
            writer = self._store._ensure_writer()
            # one submission id per call kind (straw-queue's receipts are bound to the
            # api): write_records and record_set of one request may share it
            known = writer.index.get((api, submission_id))
            if known is not None:
                if known.digests != digests:
                    raise IdempotencyConflict(
                        f"submission_id {submission_id!r} was already used by writer "
                        f"{self._store.writer_id!r} for different content through "
                        f"{API_CALLS[api]}; use a new submission_id for new content"
                    )
                self._check_not_reclaimed(known.refs, submission_id, api)
                return list(known.refs)
            self._check_dependencies(normalized)
            check_usage(normalized)
            refs = self._write(writer, submission_id, normalized, api)
            writer.index[(api, submission_id)] = Submission(digests, tuple(refs), api)
            if self._retention.holds:  # a retry that succeeded: its edges hold what it held
                self._retention.drop_holds(
                    {hold_owners.hold_owner(self._store.writer_id, api, submission_id)})
            m = self.metrics
            m["payload_bytes"] += sum(n.own_bytes for n in normalized)
            m["records"] += sum(len(n.recs) for n in normalized)
            m["segments"] += len(normalized)
            m["publish_seconds"] = (m["publish_seconds"] + [self._store.clock.now() - started]
                                    )[-PUBLISH_SECONDS_KEPT:]
            return refs

    def _check_not_reclaimed(self, refs: Sequence[RecordSetRef | RecordRef],
                             submission_id: str, api: str) -> None:
        """A retry whose original result (or a dependency of it) garbage collection has
        reclaimed since gets no reference to bytes that are gone (straw-queue's rule):
        ``InvalidReference``, and the writer takes new requests as before.  Only retries
        pay for this look-up."""
        with self._store.catalog.locked() as st:
            gone = st.tombstoned_dependency(
                (r.segment.path, r.segment.offset) for r in refs)
        if gone is not None:
            raise InvalidReference(
                f"Reference has been reclaimed: submission_id {submission_id!r} of writer "
                f"{self._store.writer_id!r} ({API_CALLS[api]}) published data in {gone[0]}, which "
                "garbage collection has reclaimed since; retain a result before releasing "
                "it if it must live on, or publish again under a new submission_id")

    def lookup_submission(self, submission_id: str) -> tuple[RecordSetRef, ...] | None:
        self._store._check_process()
        check_submission_id(submission_id)
        with self._store._write_lock:
            self._store._check_open()
            index = self._store._ensure_writer().index
            known = next((index[k] for k in (("publish", submission_id),
                                             ("record_set", submission_id),
                                             ("records", submission_id)) if k in index), None)
        return tuple(known.refs) if known else None

    def _write(self, writer: WriterIncarnation, submission_id: str,
               normalized: list[Normalized], api: str) -> list[RecordSetRef]:
        store = self._store
        estimate = sum(n.own_bytes + 1024 + 256 * len(n.members) for n in normalized)
        start = writer.next_offset(estimate)
        pos = start
        extents = []
        placed: list[RecordSetRef] = []
        edges: list[tuple[Extent, list[Extent]]] = []
        with_edges = set(store.catalog.state.edges)  # extents known to have dependencies
        for i, n in enumerate(normalized):
            dep_refs = [placed[d] if isinstance(d, int) else d for d in n.deps]
            dep_rows = [[r.path, r.offset, r.size, bytes.fromhex(r.checksum),
                         bytes.fromhex(r.digest), r.records, r.manifest.ordinal,
                         r.payload_bytes, r.tokens] for r in dep_refs]
            # D1/D4: dependencies (and a record set's records) are retained, as edges of
            # this staged extent, before its bytes are written.  Edges that cannot matter
            # are skipped: a target in the same pack with no edges of its own is
            # protected by the pack itself.
            targets = [(r.path, r.offset) for r in dep_refs]
            targets += [(m.segment.path, m.segment.offset) for m, _ in n.members]
            if any(p != writer.pack_rel or (p, o) in with_edges for p, o in targets):
                edges.append(((writer.pack_rel, pos), sorted(set(targets))))
                with_edges.add((writer.pack_rel, pos))
            # usage includes the dependencies, transitively (theirs include theirs)
            payload_bytes = n.pub_bytes + sum(r.payload_bytes for r in dep_refs)
            tokens = n.pub_tokens + sum(r.tokens for r in dep_refs)
            ext = encode_extent(run_id=store.run_id, submission_id=submission_id, index=i,
                                count=len(normalized), digest=n.digest, records=n.recs,
                                dependencies=dep_rows, offset=pos, group_start=start,
                                payload_bytes=payload_bytes, tokens=tokens, api=api,
                                members=n.member_rows)
            extents.append(ext)
            placed.append(ref_from_entry(store.run_id, writer.pack_rel, ext.entry))
            pos += ext.entry.size
        if edges:
            store.catalog.record_edges(edges)
        return writer.append(extents)

    def _check_dependencies(self, normalized: list[Normalized]) -> None:
        """D1/D4: every dependency must name a publication of the pool (checked after the
        idempotency lookup, so a retry is answered as the original was, D7)."""
        for i, n in enumerate(normalized):
            for k, d in enumerate(n.deps):
                if isinstance(d, RecordSetRef):
                    self._store.check_published(d, f"publications[{i}].dependencies[{k}]")
