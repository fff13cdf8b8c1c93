"""Fixed store workloads for the crash campaigns, their acknowledgement log, and the
post-crash check.

Role: a workload drives ``SharedFilesystemStore`` on a ``SimFS`` through a fixed,
deterministic sequence (same ops in the same order for every seed), and records, in
memory, every submission it *attempted* (before the call) and every one that was
*acknowledged* (the moment ``publish``/``publish_many`` returned).  A crash may cut the
workload anywhere; ``recover_and_check`` then opens a new store on what survived and
checks it against that log:

* every acknowledged publication reads back intact (records, codecs, metadata, bytes);
* ``lookup_submission`` finds every acknowledged submission id with the same refs, and a
  retry of it returns the same refs (D7);
* a submission that was attempted but not acknowledged is either unknown or, if lookup
  returns it, reads back as exactly the attempted content (never something else);
  retrying it then yields a publication that reads back intact;
* a fresh publication after recovery works and reads back;
* a garbage collection after recovery reclaims nothing acknowledged that was not
  released (staged or retained publications and their dependencies survive, D4);
* nothing raises (there is no real corruption in these campaigns, so even ``CorruptData``
  is a violation here).

Anything else is a ``Violation``.  The check returns the acknowledgement log as it stands
after recovery (what recovery told the user), so a campaign can crash again and re-check.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from straw import Publication, Record, RecordSetRef, SharedFilesystemStore
from straw.clock import ManualClock
from straw.fs import Filesystem

ROOT = "/pool"
RUN = "run"
WRITER = "w0"


class Violation(Exception):
    """The store broke a durability or idempotency obligation."""


@dataclass(frozen=True)
class StoreParams:
    """How the workload's stores are opened (the check reopens with the same)."""

    reserve_bytes: int = 64 * 1024
    segment_target_bytes: int = 1 << 20

    def open(self, fs: Filesystem) -> SharedFilesystemStore:
        return SharedFilesystemStore(
            ROOT, RUN, writer_id=WRITER, fs=fs, clock=ManualClock(),
            reserve_bytes=self.reserve_bytes, segment_target_bytes=self.segment_target_bytes,
            visibility_retries=2, visibility_backoff=0.01,
        )


@dataclass
class AckRecord:
    """What the driver attempted (submission id -> publications, in order) and what was
    acknowledged (submission id -> refs, recorded when the call returned)."""

    attempts: dict[str, list[Publication]] = field(default_factory=dict)
    acks: dict[str, tuple[RecordSetRef, ...]] = field(default_factory=dict)
    # released and not retained (marked just BEFORE the releasing call): garbage
    # collection may reclaim them, so they are not checked any more
    collectable: set[str] = field(default_factory=set)

    def copy(self) -> AckRecord:
        return AckRecord(dict(self.attempts), dict(self.acks), set(self.collectable))


class Driver:
    """Runs a workload on one filesystem and keeps its acknowledgement log."""

    def __init__(self, fs: Filesystem, params: StoreParams) -> None:
        self.fs = fs
        self.params = params
        self.log = AckRecord()

    def open(self) -> SharedFilesystemStore:
        return self.params.open(self.fs)

    def publish_many(self, store: SharedFilesystemStore, sid: str,
                     pubs: list[Publication]) -> list[RecordSetRef]:
        self.log.attempts.setdefault(sid, pubs)
        refs = store.publish_many(pubs, submission_id=sid)
        self.log.acks[sid] = tuple(refs)  # acknowledged: the call returned
        return refs

    def publish(self, store: SharedFilesystemStore, sid: str, records: list[Record],
                deps: tuple[RecordSetRef, ...] = ()) -> RecordSetRef:
        return self.publish_many(store, sid, [Publication(records, deps)])[0]


def payload(tag: str, size: int) -> bytes:
    return random.Random(f"{tag}:{size}").randbytes(size)


def rec(rid: str, size: int, *, meta: bool = False) -> Record:
    return Record(rid, payload(rid, size), "bytes.v1", {"n": size, "tag": rid} if meta else {})


# --- the workloads -------------------------------------------------------------------------

def wl_publish(d: Driver) -> None:
    """Publications of several sizes, across sector and reservation boundaries."""
    s = d.open()
    for i, size in enumerate((0, 1, 100, 511, 513, 4096, 70_000, 3)):
        d.publish(s, f"p{i}", [rec(f"p{i}", size, meta=i % 2 == 0)])
    d.publish(s, "p-multi", [rec("m0", 700), rec("m1", 0), rec("m2", 1500, meta=True)])
    s.close()


def wl_publish_many(d: Driver) -> None:
    """publish_many with index and ref dependencies, one durable write per batch."""
    s = d.open()
    base = d.publish(s, "base", [rec("base", 300)])
    batch = d.publish_many(s, "batch1", [
        Publication([rec("a", 900)]),
        Publication([rec("b", 2000), rec("b2", 10)], dependencies=(0,)),
        Publication([rec("c", 50)], dependencies=(base, 1)),
    ])
    d.publish_many(s, "batch2", [
        Publication([rec("d", 5000)], dependencies=tuple(batch)),
        Publication([rec("e", 1)], dependencies=(0, base)),
    ])
    d.publish(s, "tail", [rec("tail", 600)], deps=(batch[2],))
    s.close()


def wl_rotation(d: Driver) -> None:
    """Small segment target: packs rotate (seal + new pack) and an explicit seal."""
    s = d.open()
    for i in range(5):
        d.publish(s, f"r{i}", [rec(f"r{i}", 2500 + 300 * i)])
    s.seal()
    d.publish(s, "after-seal", [rec("after-seal", 800)])
    d.publish_many(s, "rot-batch", [Publication([rec("x", 3000)]),
                                    Publication([rec("y", 3000)], dependencies=(0,))])
    d.publish(s, "last", [rec("last", 10)])
    s.close()


def wl_restart(d: Driver) -> None:
    """Writer restart: close, reopen the same writer id, retry a submission (same refs),
    publish more; then a second restart without a clean close of the pack."""
    s = d.open()
    d.publish(s, "a", [rec("a", 1000)])
    b = d.publish(s, "b", [rec("b", 200)])
    s.close()
    s = d.open()
    again = s.publish([rec("b", 200)], submission_id="b")
    if again != b:
        raise Violation(f"retry of 'b' after a clean restart returned {again}, not {b}")
    d.publish(s, "c", [rec("c", 3000)], deps=(b,))
    d.publish_many(s, "d", [Publication([rec("d0", 10)]), Publication([rec("d1", 20)], (0,))])
    s.close()
    s = d.open()
    if s.lookup_submission("c") != d.log.acks["c"]:
        raise Violation("lookup of 'c' after the second clean restart differs")
    d.publish(s, "e", [rec("e", 400)])
    s.close()


def wl_retention(d: Driver) -> None:
    """The ownership catalog: retain (with a transitive dependency), release staging,
    collect garbage across sealed packs, release an owner, collect again."""
    s = d.open()
    a = d.publish(s, "ga", [rec("ga", 3000)])
    b = d.publish(s, "gb", [rec("gb", 3000)], deps=(a,))
    x = d.publish(s, "gx", [rec("gx", 3000)])
    s.retain("keep", [b])  # b, and a through its dependency
    d.log.collectable.add("gx")
    s.release_publications([a, b, x])
    s.seal()
    s.collect_garbage()
    y = d.publish(s, "gy", [rec("gy", 5000)])
    z = d.publish(s, "gz", [rec("gz", 100)], deps=(y,))
    s.retain("keep2", [z])
    s.release_publications([y, z])
    d.log.collectable.update({"ga", "gb"})
    s.release("keep")
    s.seal()
    s.collect_garbage()
    d.publish(s, "gw", [rec("gw", 700)])
    s.close()


@dataclass(frozen=True)
class Workload:
    name: str
    run: Callable[[Driver], None]
    params: StoreParams


def workloads(reserve: int) -> list[Workload]:
    """The campaign workloads for one reservation size (0: plain appends)."""
    big = StoreParams(reserve_bytes=reserve)
    small = StoreParams(reserve_bytes=reserve, segment_target_bytes=8 * 1024)
    return [
        Workload("publish", wl_publish, big),
        Workload("publish_many", wl_publish_many, big),
        Workload("rotation", wl_rotation, small),
        Workload("restart", wl_restart, big),
        Workload("retention", wl_retention, small),
    ]


# --- the check ------------------------------------------------------------------------------

def _same_content(store: SharedFilesystemStore, refs: list[RecordSetRef],
                  pubs: list[Publication], what: str) -> None:
    if len(refs) != len(pubs):
        raise Violation(f"{what}: {len(refs)} refs for {len(pubs)} publications")
    for i, (ref, pub) in enumerate(zip(refs, pubs, strict=True)):
        got = list(store.read(ref))
        want = list(pub.records)
        if len(got) != len(want):
            raise Violation(f"{what}[{i}] {ref}: {len(got)} records read, {len(want)} published")
        for g, w in zip(got, want, strict=True):
            if g != w:
                raise Violation(f"{what}[{i}] {ref}: record {w.record_id!r} reads back as "
                                f"{g.record_id!r} with different content")


def recover_and_check(fs: Filesystem, params: StoreParams, log: AckRecord,
                      fresh_tag: str = "fresh", out: AckRecord | None = None) -> AckRecord:
    """Open a new store on what survived; check it against ``log`` (see the module
    docstring).  Returns the log as it stands after recovery: lookups that returned refs,
    retries and the fresh publication count as acknowledged now.  Pass ``out`` to have
    that log updated as the check goes (so a crash in the middle of recovery leaves what
    had been acknowledged so far)."""
    if out is None:
        out = log.copy()
    store = params.open(fs)
    skip = log.collectable
    try:
        for sid, refs in log.acks.items():
            if sid in skip:
                continue
            got = store.lookup_submission(sid)
            if got != refs:
                raise Violation(f"lookup_submission({sid!r}) of an acknowledged submission "
                                f"returned {got}, acknowledged {refs}")
            _same_content(store, refs, log.attempts[sid], f"acknowledged {sid!r}")
        for sid, pubs in log.attempts.items():
            if sid in log.acks or sid in skip:
                continue
            got = store.lookup_submission(sid)
            if got is not None:
                out.acks[sid] = got
                _same_content(store, got, pubs, f"unacknowledged {sid!r} found by lookup")
        for sid, refs in log.acks.items():
            if sid in skip:
                continue
            again = store.publish_many(log.attempts[sid], submission_id=sid)
            if again != refs:
                raise Violation(f"retry of acknowledged {sid!r} returned {again}, "
                                f"acknowledged {refs}")
        for sid, pubs in log.attempts.items():
            if sid in log.acks or sid in skip:
                continue
            refs = store.publish_many(pubs, submission_id=sid)
            if sid in out.acks and refs != out.acks[sid]:
                raise Violation(f"retry of {sid!r} returned {refs}, lookup said "
                                f"{out.acks[sid]}")
            out.acks[sid] = refs
            _same_content(store, refs, pubs, f"retried {sid!r}")
        fresh = [Publication([rec(fresh_tag, 777)])]
        out.attempts[fresh_tag] = fresh
        refs = store.publish_many(fresh, submission_id=fresh_tag)
        out.acks[fresh_tag] = refs
        _same_content(store, refs, fresh, "fresh publication after recovery")
        # D4: whatever is acknowledged and neither released nor reclaimable survives a
        # collection (staged or retained, directly or through a dependency)
        store.collect_garbage()
        for sid, refs in out.acks.items():
            if sid not in skip:
                _same_content(store, refs, out.attempts[sid], f"{sid!r} after a collection")
    finally:
        store.close()
    return out
