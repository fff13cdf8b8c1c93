"""What the store scenario's writers acknowledge, and how it is checked: each
submission's publications regenerated from its payload seed (``content``) and read back
(``check_read``), the ack logs present and the refs of an entry (``writer_ids``,
``entry_refs``, ``entry_dep``), and, for the shared-root scenario, a writer's retention
steps (``Retention``) and the log they leave (``RetentionLog``): which submissions may
have been reclaimed, which windows the owner may hold."""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from straw import Publication, Record, RecordSetRef, SharedFilesystemStore
from straw.fs import PosixFS
from straw.publication_log import AckLog

# --- content ------------------------------------------------------------------------------

def _size(r: random.Random) -> int:
    x = r.random()
    if x < 0.75:
        return r.randint(0, 4096)
    if x < 0.99:
        return r.randint(4096, 64 * 1024)
    return r.randint(64 * 1024, 1024 * 1024)


def content(payload_seed: str, dep: RecordSetRef | None) -> list[Publication]:
    """The publications of one submission, regenerated from its payload seed (``dep``:
    the writer's previous acknowledged ref, named as a dependency by some batches)."""
    r = random.Random(payload_seed)
    n_pubs = 1 if r.random() < 0.7 else r.randint(2, 3)
    pubs = []
    for i in range(n_pubs):
        recs = []
        for j in range(1 if r.random() < 0.8 else r.randint(2, 3)):
            size = _size(r)
            recs.append(Record(f"r{i}.{j}", r.randbytes(size), "bytes.v1",
                               {"seed": payload_seed, "i": i, "j": j}))
        deps: list[RecordSetRef | int] = []
        if i > 0 and r.random() < 0.5:
            deps.append(i - 1)
        if dep is not None and r.random() < 0.3:
            deps.append(dep)
        pubs.append(Publication(recs, tuple(deps)))
    return pubs


def check_read(store: SharedFilesystemStore, refs: Sequence[RecordSetRef],
               pubs: Sequence[Publication]) -> int:
    """Raise AssertionError unless ``refs`` read back as ``pubs``; returns bytes checked."""
    if len(refs) != len(pubs):
        raise AssertionError(f"{len(refs)} refs for {len(pubs)} publications")
    n = 0
    for ref, pub in zip(refs, pubs, strict=True):
        got = list(store.read(ref))
        if len(got) != len(pub.records) or any(
                g != w for g, w in zip(got, pub.records, strict=True)):
            raise AssertionError(f"{ref} does not read back as what was published")
        n += sum(len(bytes(w.payload)) for w in pub.records)
    return n


def entry_refs(entry: dict[str, Any]) -> tuple[RecordSetRef, ...]:
    # a tuple, as publish_many and lookup_submission return them
    return tuple(RecordSetRef.from_dict(d) for d in entry["refs"])


def entry_dep(entries_by_seq: dict[int, dict[str, Any]], seq: int) -> RecordSetRef | None:
    prev = entries_by_seq.get(seq - 1)
    return entry_refs(prev)[0] if prev else None


# --- retention (the shared-root scenario) -------------------------------------------------

RETAIN_WINDOW = 4  # the latest acknowledged submissions a writer's owner holds


def retention_log(acks: str, writer_id: str) -> AckLog:
    return AckLog(PosixFS(), os.path.join(acks, f"ret-{writer_id}.log"))


@dataclass
class RetentionLog:
    """What a writer's retention log says: the submissions whose staging may have been
    dropped (``unstaged``), the window of its last completed retain (``done``) and of the
    intents since (a retain that a kill cut short may or may not have happened): the
    owner's roots are one of those windows."""

    unstaged: set[int] = field(default_factory=set)
    done: list[int] | None = None
    intents: list[list[int]] = field(default_factory=list)

    @classmethod
    def read(cls, acks: str, writer_id: str) -> RetentionLog:
        out = cls()
        for e in retention_log(acks, writer_id).read():
            if e["kind"] == "retain-intent":
                out.intents.append(e["seqs"])
            elif e["kind"] == "retain":
                out.done, out.intents = e["seqs"], []
            elif e["kind"] == "unstage-intent":
                out.unstaged.update(e["seqs"])
        return out

    def windows(self) -> list[list[int] | None]:
        return [self.done, *self.intents]


class Retention:
    """A writer's retention steps: retain the latest ``RETAIN_WINDOW`` acknowledged
    submissions under ``keep-<writer>`` (replacing the previous window), drop the staging
    of all acknowledged so far, and now and then collect garbage; each step logged before
    it is taken."""

    def __init__(self, acks: str, writer_id: str) -> None:
        self.log = retention_log(acks, writer_id)
        self.owner = f"keep-{writer_id}"
        self.unstaged = RetentionLog.read(acks, writer_id).unstaged

    def step(self, store: SharedFilesystemStore, by_seq: dict[int, dict[str, Any]],
             r: random.Random) -> None:
        x = r.random()
        if x < 0.2:
            self.retain(store, by_seq)
        elif x < 0.26:
            store.collect_garbage()

    def retain(self, store: SharedFilesystemStore, by_seq: dict[int, dict[str, Any]]) -> None:
        """Retain the latest window, then drop the staging of everything acknowledged so
        far (what is not in the window becomes collectable)."""
        window = sorted(by_seq)[-RETAIN_WINDOW:]
        self.log.append({"kind": "retain-intent", "seqs": window})
        store.retain(self.owner, [ref for q in window for ref in entry_refs(by_seq[q])])
        self.log.append({"kind": "retain", "seqs": window})
        staged = [q for q in sorted(by_seq) if q not in self.unstaged]
        self.log.append({"kind": "unstage-intent", "seqs": staged})
        self.unstaged.update(staged)
        store.release_publications([ref for q in staged for ref in entry_refs(by_seq[q])])

    def finish(self, store: SharedFilesystemStore, by_seq: dict[int, dict[str, Any]]) -> None:
        """A job's clean end (SIGTERM): seal, retain the last window, collect."""
        store.seal()
        if by_seq:
            self.retain(store, by_seq)
        store.collect_garbage()

    def close(self) -> None:
        self.log.close()


def writer_ids(acks: str, writers: Sequence[str]) -> list[str]:
    """The original writers and every forked child that logged an acknowledgement."""
    found = set(writers)
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(acks):
            if name.startswith("acks-") and name.endswith(".log"):
                found.add(name[len("acks-"):-len(".log")])
    return sorted(found)
