"""Crash campaign for the ownership catalog (``python -m fault_injection.catalog_campaign``).

Role: verification layer 6 for retention (issue 5, item 6).  Fixed workloads drive two
stores -- clients ``c0`` and ``c1`` of one SimFS, each with its own ``writer_id`` --
through publish (with a dependency across clients), retain, release, release_publications,
pin (held while the other client collects) and collect_garbage.  A probe run counts the
mutating filesystem ops; then, for every one of them, the workload is rerun with a crash
*before* and *after* that op (plus the completed run), and for each crash state every mode:

* ``power/<variant>``: power loss of the whole filesystem (``clear-cache``, ``torn-seq``,
  ``torn-op``);
* ``kill``: SIGKILL of the client whose op crashed; the other client then closes cleanly.

Then both stores are reopened on what survived and checked against the workload's model
(what each call that *returned* committed, and what the interrupted call would commit):

* nothing owned, pinned or staged -- in both the state before and the state after the
  interrupted call -- was reclaimed: it reads back intact, with its whole dependency
  closure (D4), and still does after one more collection by each recovered client;
* every committed catalog operation is visible: each owner's roots are what the last
  committed retain/release left (or what the interrupted call would leave), pins entered
  and not exited are still owners, released staging stays released, and every pack a
  completed collection tombstoned is tombstoned and its file gone (D3);
* recovery raises nothing.

Each state runs on a fresh ``SimFS`` seeded from its key, so ``--replay KEY`` reruns it.

The damaged-tail check (``check_damaged_tail``, issue 11 finding 3): after each completed
workload, one byte at a time of the last acknowledged catalog transaction is flipped; a
fresh client must fail closed with ``CorruptData`` (D6), never cut it off as a torn tail.
Its negative control (``fault_injection.controls.CATALOG_CONTROLS``: the catalog without
confirm frames) must be caught.

Compaction (CS1, issue 13): the ``compact`` workload compacts the catalog three times (one
with operations committed by the other client while the snapshot was written), so its
crash points include every step of a compaction; every crash state must recover to the
old or the new catalog state (they hold the same content).  Its negative controls
(``COMPACTION_CONTROLS``: the snapshot not made durable before the truncation; the base
frame without the suffix) must each break some crash state of those compactions.  Exit
status 1 on any violation or a missed control.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import msgpack

from fault_injection.controls import CATALOG_CONTROLS, COMPACTION_CONTROLS
from fault_injection.rules import MUTATING_OPS, SimulatedCrash
from fault_injection.simfs import SimFS
from straw import CorruptData, Record, RecordSetRef, SharedFilesystemStore, framing
from straw.catalog import CATALOG_NAME, Catalog, CatalogState
from straw.clock import ManualClock
from straw.store import Pin

ROOT = "/pool"
RUN = "run"
CLIENTS = ("c0", "c1")
MODES = ("power/clear-cache", "power/torn-seq", "power/torn-op", "kill")

Extent = tuple[str, int]


class Violation(Exception):
    """The catalog broke a retention obligation."""


def open_store(sim: SimFS, client: str) -> SharedFilesystemStore:
    return SharedFilesystemStore(ROOT, RUN, writer_id=client, fs=sim.client(client),
                                 clock=ManualClock(), reserve_bytes=0, visibility_retries=1)


# --- the model -------------------------------------------------------------------------------

@dataclass
class Model:
    """What the workload's committed calls established (names of publications)."""

    staged: set[str] = field(default_factory=set)
    owners: dict[str, frozenset[str]] = field(default_factory=dict)
    deps: dict[str, tuple[str, ...]] = field(default_factory=dict)
    tombstoned: set[str] = field(default_factory=set)  # pack paths of completed collections

    def copy(self) -> Model:
        return Model(set(self.staged), dict(self.owners), dict(self.deps), set(self.tombstoned))

    def protected(self) -> set[str]:
        todo = list(self.staged) + [n for roots in self.owners.values() for n in roots]
        out: set[str] = set()
        while todo:
            n = todo.pop()
            if n not in out:
                out.add(n)
                todo.extend(self.deps.get(n, ()))
        return out


class Driver:
    """Runs a workload and keeps the model: ``pre`` (committed) and ``post`` (what the call
    in flight would commit; equal to ``pre`` between calls)."""

    def __init__(self, sim: SimFS) -> None:
        self.sim = sim
        self.stores = {c: open_store(sim, c) for c in CLIENTS}
        self.pre = Model()
        self.post = Model()
        self.refs: dict[str, RecordSetRef] = {}
        self.records: dict[str, list[Record]] = {}
        self.pins: dict[str, Pin] = {}  # pin owner -> Pin
        # (before, after) counts of mutating ops around each compaction step: the crash
        # points inside compaction (tests/test_catalog_snapshot.py)
        self.compaction_ops: list[tuple[int, int]] = []

    def _mutations(self) -> int:
        return sum(1 for e in self.sim.trace if e.op in MUTATING_OPS)

    def _compaction_step(self, fn: Callable[[], object]) -> None:
        lo = self._mutations()
        try:
            self._call(lambda m: None, fn)
        finally:
            self.compaction_ops.append((lo, self._mutations()))

    def _call(self, change: Callable[[Model], None], fn: Callable[[], object]) -> object:
        self.post = self.pre.copy()
        change(self.post)
        out = fn()
        self.pre = self.post.copy()
        return out

    def publish(self, client: str, name: str, deps: Sequence[str] = ()) -> RecordSetRef:
        recs = [Record(name, (name.encode() * 40)[:100 + 37 * len(name)], "bytes.v1",
                       {"name": name})]
        self.records[name] = recs
        dep_refs = [self.refs[d] for d in deps]
        # an acknowledged publication is staged from the moment it returns; before that it
        # protects nothing the model relies on
        ref = self.stores[client].publish(recs, submission_id=name, dependencies=dep_refs)
        self.refs[name] = ref
        self.pre.staged.add(name)
        self.pre.deps[name] = tuple(deps)
        self.post = self.pre.copy()
        return ref

    def seal(self, client: str) -> None:
        self._call(lambda m: None, self.stores[client].seal)

    def retain(self, client: str, owner: str, names: Sequence[str]) -> None:
        def change(m: Model) -> None:
            m.owners[owner] = frozenset(names)
        self._call(change, lambda: self.stores[client].retain(
            owner, [self.refs[n] for n in names]))

    def release(self, client: str, owner: str) -> None:
        self._call(lambda m: m.owners.pop(owner, None),
                   lambda: self.stores[client].release(owner))

    def release_publications(self, client: str, names: Sequence[str]) -> None:
        self._call(lambda m: m.staged.difference_update(names),
                   lambda: self.stores[client].release_publications(
                       [self.refs[n] for n in names]))

    def pin(self, client: str, names: Sequence[str]) -> str:
        pin = self.stores[client].pin([self.refs[n] for n in names])
        self.pins[pin.owner] = pin

        def change(m: Model) -> None:
            m.owners[pin.owner] = frozenset(names)
        self._call(change, pin.__enter__)
        return pin.owner

    def unpin(self, owner: str) -> None:
        pin = self.pins[owner]
        self._call(lambda m: m.owners.pop(owner, None), lambda: pin.__exit__(None, None, None))

    def collect(self, client: str) -> None:
        res: dict[str, object] = {}

        def run() -> None:
            res.update(self.stores[client].collect_garbage())
        self._call(lambda m: None, run)
        tomb = res["tombstoned"]
        assert isinstance(tomb, list)
        self.pre.tombstoned.update(tomb)
        self.post = self.pre.copy()


    def compact(self, client: str) -> None:
        """A whole compaction (CS1): the catalog's content does not change."""
        self._compaction_step(self.stores[client].catalog.compact)

    def compact_around(self, client: str, meanwhile: Callable[[], None]) -> None:
        """A compaction whose snapshot is written (steps 1-2) before ``meanwhile`` commits
        on another client, then installed (steps 3-6): the base frame must carry the
        operations appended after the snapshot (the suffix)."""
        cat = self.stores[client].catalog
        jobs: list[object] = []
        self._compaction_step(lambda: jobs.append(cat._write_snapshot()))
        meanwhile()
        job = jobs[0]
        if job is not None:
            self._compaction_step(lambda: cat._make_base(job))  # type: ignore[arg-type]


# --- the workloads ---------------------------------------------------------------------------

def wl_owners(d: Driver) -> None:
    """Cross-client dependencies, owners replaced and released, staging dropped, two
    collectors."""
    d.publish("c0", "a")
    d.publish("c0", "b", deps=["a"])
    d.seal("c0")
    d.publish("c1", "x")
    d.publish("c1", "y", deps=["b"])  # c1's pack depends on c0's
    d.retain("c1", "keep", ["y"])  # y -> b -> a
    d.release_publications("c0", ["a", "b", "x", "y"])
    d.seal("c1")
    d.collect("c0")  # reclaims nothing: keep reaches both packs
    d.publish("c0", "z")
    d.seal("c0")
    d.release_publications("c1", ["z"])
    d.retain("c0", "keep", ["x"])  # replaces: y, b, a no longer retained
    d.collect("c1")  # reclaims c0's packs (a, b and z)
    d.release("c1", "keep")
    d.collect("c0")  # reclaims c1's pack
    d.publish("c1", "w")
    d.collect("c1")  # w is staged (and its pack open): nothing


def wl_pins(d: Driver) -> None:
    """A pin held on one client while the other collects; released, then collected."""
    d.publish("c0", "p")
    d.publish("c0", "q", deps=["p"])
    d.seal("c0")
    d.publish("c1", "r", deps=["q"])
    d.seal("c1")
    owner = d.pin("c1", ["r"])  # r -> q -> p
    d.release_publications("c0", ["p", "q", "r"])
    d.collect("c0")  # the pin keeps everything
    d.retain("c0", "ckpt", ["q"])
    d.unpin(owner)
    d.collect("c1")  # reclaims r's pack; q (and p, same pack) stay
    owner2 = d.pin("c0", ["q"])
    d.release("c1", "ckpt")
    d.collect("c1")  # the second pin keeps q's pack
    d.unpin(owner2)
    d.collect("c0")  # everything released: reclaimed


def wl_compact(d: Driver) -> None:
    """Catalog compaction (CS1) between owner changes and collections: a plain one, one
    with operations committed by the other client while its snapshot was written, and
    one that replaces a generation (its older snapshot is deleted)."""
    d.publish("c0", "a")
    d.publish("c0", "b", deps=["a"])
    d.seal("c0")
    d.publish("c1", "x")
    d.retain("c1", "keep", ["b", "x"])
    d.release_publications("c0", ["a", "b"])
    d.collect("c0")  # keep reaches both packs: nothing
    d.compact("c0")
    d.publish("c1", "y")
    d.seal("c1")
    d.retain("c0", "ckpt", ["y"])
    d.compact_around("c1", lambda: d.release("c0", "keep"))
    d.release_publications("c1", ["x", "y"])
    d.collect("c1")  # reclaims c0's pack (a, b): keep was released in the suffix
    d.compact("c0")


WORKLOADS: dict[str, Callable[[Driver], None]] = {"owners": wl_owners, "pins": wl_pins,
                                                  "compact": wl_compact}


# --- the check -------------------------------------------------------------------------------

def _catalog(sim: SimFS) -> CatalogState:
    cat = Catalog(sim.client("checker"), ROOT)
    try:
        with cat.locked() as st:
            return st
    finally:
        cat.close()


def recover_and_check(sim: SimFS, d: Driver) -> None:
    """Reopen both clients on what survived and check them against the driver's model."""
    stores = {c: open_store(sim, c) for c in CLIENTS}
    try:
        for s in stores.values():
            s.lookup_submission("recovery-probe")  # restart the writer (seals dead packs)
        must = d.pre.protected() & d.post.protected()
        _check_reads(stores, d, must, "after recovery")
        st = _catalog(sim)

        def ext(names: frozenset[str] | None) -> frozenset[Extent] | None:
            if names is None:
                return None
            return frozenset((d.refs[n].path, d.refs[n].offset) for n in names)

        for owner in set(d.pre.owners) | set(d.post.owners):
            roots = st.run_owners(RUN).get(owner)
            got = None if roots is None else frozenset(roots)
            allowed = {ext(d.pre.owners.get(owner)), ext(d.post.owners.get(owner))}
            if got not in allowed:
                raise Violation(f"owner {owner!r} has roots {got}; committed "
                                f"{ext(d.pre.owners.get(owner))}")
        stray = set(st.run_owners(RUN)) - set(d.pre.owners) - set(d.post.owners)
        if stray:
            raise Violation(f"owners nobody committed: {sorted(stray)}")
        for name in sorted(set(d.refs) - d.pre.staged - d.post.staged):
            ref = d.refs[name]  # staging released by a committed call: stays released
            info = st.packs.get(ref.path)
            if info is not None and not info.tombstoned and ref.offset not in info.unstaged:
                raise Violation(f"released staging of {name!r} is not visible in the catalog")
        for path in d.pre.tombstoned:
            info = st.packs.get(path)
            if info is None or not info.tombstoned:
                raise Violation(f"pack {path} tombstoned by a completed collection is not "
                                "tombstoned in the catalog")
            if os.path.join(ROOT, path) in sim.files():
                raise Violation(f"pack {path} reclaimed by a completed collection exists again")
        for c in CLIENTS:
            stores[c].collect_garbage()
            _check_reads(stores, d, must, f"after a collection by {c}")
    finally:
        for s in stores.values():
            s.close()


def _check_reads(stores: dict[str, SharedFilesystemStore], d: Driver, names: set[str],
                 when: str) -> None:
    for i, name in enumerate(sorted(names)):
        store = stores[CLIENTS[i % len(CLIENTS)]]
        with store.read_session() as rs:
            got = list(rs.read(d.refs[name]))
        if got != d.records[name]:
            raise Violation(f"{name!r} ({d.refs[name]}) reads back different {when}")


# --- the campaign ----------------------------------------------------------------------------

def state_seed(key: str) -> int:
    return zlib.crc32(key.encode())


def mutating_ops(workload: str) -> int:
    probe = SimFS(0)
    WORKLOADS[workload](Driver(probe))
    return sum(1 for e in probe.trace if e.op in MUTATING_OPS)


def run_state(workload: str, nth: int | None, when: str, mode: str) -> str | None:
    """One crash state; returns a violation report or None."""
    key = f"{workload}:{nth if nth is not None else 'end'}:{when}:{mode}"
    sim = SimFS(state_seed(key))
    if nth is not None:
        sim.crash_at(nth, ops=MUTATING_OPS, when=when)
    stage = "workload"
    d: Driver | None = None
    try:
        try:
            d = Driver(sim)
            WORKLOADS[workload](d)
            crashed = None
        except SimulatedCrash:
            crashed = next(iter(sim.plan.dead), None)
        if d is None:
            return None  # crashed while opening the pool: nothing was committed yet
        stage = f"crash ({mode})"
        if mode == "kill":
            if crashed is not None:
                sim.kill_client(crashed)
            for c, s in d.stores.items():
                if c != crashed:
                    s.close()  # the other process shuts down cleanly
        else:
            sim.crash(mode.split("/", 1)[1])
        stage = "recovery"
        recover_and_check(sim, d)
        stage = "clean restart"
        recover_and_check(sim, d)
    except (Violation, Exception, SimulatedCrash) as e:
        kind = "violation" if isinstance(e, Violation) else f"raised {type(e).__name__}"
        tb = "" if isinstance(e, Violation) else "\n" + "".join(
            traceback.format_exception(type(e), e, e.__traceback__, limit=-4))
        return (f"[{key}] {stage}: {kind}: {e}{tb}\n  replay: python -m "
                f"fault_injection.catalog_campaign --replay {key}\n  {sim.describe()[:2000]}")
    return None


def crash_points(workload: str, max_points: int | None = None
                 ) -> Iterator[tuple[int | None, str]]:
    n = mutating_ops(workload)
    pts: list[tuple[int | None, str]] = [(i, w) for i in range(1, n + 1)
                                         for w in ("before", "after")]
    if max_points is not None and len(pts) > max_points:
        step = len(pts) / max_points
        pts = [pts[int(i * step)] for i in range(max_points)]
    yield from pts
    yield (None, "complete")


@dataclass
class Report:
    workload: str
    crash_points: int = 0
    states: int = 0
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0


def run_workload(workload: str, modes: Sequence[str] = MODES,
                 max_points: int | None = None) -> Report:
    t0 = time.perf_counter()
    rep = Report(workload)
    for nth, when in crash_points(workload, max_points):
        rep.crash_points += 1
        for mode in modes:
            rep.states += 1
            msg = run_state(workload, nth, when, mode)
            if msg is not None:
                rep.violations.append(msg)
    rep.seconds = time.perf_counter() - t0
    return rep


# --- the damaged acknowledged tail (D6) ------------------------------------------------------

def check_damaged_tail(workload: str) -> list[str]:
    """Run ``workload`` to completion, then flip each byte of the catalog's last
    acknowledged transaction in turn: a fresh client must raise ``CorruptData`` (and
    leave the bytes in place), never replay as if it were a torn tail.  Returns the
    violations (the first few)."""
    sim = SimFS(state_seed(f"{workload}:damaged-tail"))
    d = Driver(sim)
    WORKLOADS[workload](d)
    for s in d.stores.values():
        s.close()
    path = f"{ROOT}/{CATALOG_NAME}"
    good = sim.files()[path]
    frames = framing.scan_frames(lambda o, n: good[o:o + n], len(good)).frames
    last = [f for f in frames
            if msgpack.unpackb(f.body, raw=False, strict_map_key=False)["ops"]][-1]
    violations = []
    for i in range(last.offset, last.offset + last.header.frame_length):
        _write_catalog(sim, path, _flipped(good, i))
        cat = Catalog(sim.client("checker"), ROOT)
        try:
            with cat.locked():
                pass
            violations.append(
                f"[{workload}:damaged-tail] byte {i} of the last acknowledged catalog "
                f"transaction (offset {last.offset}) flipped: a fresh client replayed "
                "without CorruptData (cut as a torn tail: the acknowledged transaction is "
                "silently lost)")
        except CorruptData:
            if sim.files()[path] != _flipped(good, i):
                violations.append(f"[{workload}:damaged-tail] byte {i} flipped: CorruptData, "
                                  "but the catalog was changed")
        finally:
            cat.close()
        if len(violations) >= 3:
            break
    return violations


def _flipped(data: bytes, i: int) -> bytes:
    return data[:i] + bytes([data[i] ^ 0x04]) + data[i + 1:]


def _write_catalog(sim: SimFS, path: str, data: bytes) -> None:
    fd = sim.open(path, write=True)
    try:
        sim.truncate(fd, 0)
        sim.writev(fd, [data], 0)
        sim.fsync(fd)
    finally:
        sim.close(fd)


def run_damaged_tail_controls() -> dict[str, str | None]:
    """Each catalog control against the damaged-tail check: name -> first violation it
    caused (None: MISSED; a violation the real catalog also shows does not count)."""
    baseline = {w: set(check_damaged_tail(w)) for w in sorted(WORKLOADS)}
    out: dict[str, str | None] = {}
    for name, control in CATALOG_CONTROLS.items():
        found = None
        for w in sorted(WORKLOADS):
            with control():
                new = [v for v in check_damaged_tail(w) if v not in baseline[w]]
            if new:
                found = new[0]
                break
        out[name] = found
    return out


def compaction_points() -> list[int]:
    """The mutating ops (1-based, as ``SimFS.crash_at`` counts them) inside the
    compaction workload's compactions."""
    probe = SimFS(0)
    d = Driver(probe)
    wl_compact(d)
    return [n for lo, hi in d.compaction_ops for n in range(lo + 1, hi + 1)]


def run_compaction_controls() -> dict[str, str | None]:
    """Each compaction control (``COMPACTION_CONTROLS``: CS1's order broken) against the
    crash states inside the compaction workload's compactions: name -> the first
    violation it caused (None: MISSED)."""
    out: dict[str, str | None] = {}
    points = compaction_points()
    for name, control in COMPACTION_CONTROLS.items():
        found = None
        with control():
            for nth in points:
                for mode in ("power/clear-cache", "kill"):
                    found = run_state("compact", nth, "after", mode)
                    if found is not None:
                        break
                if found is not None:
                    break
        out[name] = found
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fault_injection.catalog_campaign",
                                 description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--workload", action="append", choices=sorted(WORKLOADS))
    ap.add_argument("--max-points", type=int, default=None,
                    help="sample at most this many crash points per workload")
    ap.add_argument("--replay", metavar="KEY", help="rerun one crash state")
    args = ap.parse_args(argv)
    if args.replay:
        wl, nth, when, mode = args.replay.split(":", 3)
        msg = run_state(wl, None if nth == "end" else int(nth), when, mode)
        print(msg or f"{args.replay}: no violation")
        return 1 if msg else 0
    t0 = time.perf_counter()
    print(f"catalog crash campaign: 2 clients, crash before and after every mutating op, "
          f"modes {', '.join(MODES)}")
    reports = [run_workload(w, max_points=args.max_points)
               for w in (args.workload or sorted(WORKLOADS))]
    for r in reports:
        print(f"  {r.workload:<8} mutating ops {mutating_ops(r.workload):>4}  crash points "
              f"{r.crash_points:>4}  states {r.states:>5}  violations {len(r.violations):>3}  "
              f"{r.seconds:6.1f}s")
    violations = [v for r in reports for v in r.violations]
    print("damaged acknowledged tail (every byte of the last transaction flipped):")
    for w in args.workload or sorted(WORKLOADS):
        found = check_damaged_tail(w)
        print(f"  {w:<8} violations {len(found):>3}")
        violations += found
    print("negative controls (each must be caught):")
    controls = run_damaged_tail_controls()
    controls.update(run_compaction_controls())  # CS1: compaction's order broken
    for name, v in controls.items():
        print(f"  {'caught' if v else 'MISSED':<7} {name:<27} {(v or '')[:110]}")
    missed = [name for name, v in controls.items() if v is None]
    for v in violations[:10]:
        print("\nVIOLATION " + v)
    print(f"\nsummary: {sum(r.crash_points for r in reports)} crash points, "
          f"{sum(r.states for r in reports)} states, {len(violations)} violations; "
          f"negative controls caught {len(controls) - len(missed)}/{len(controls)}; "
          f"{time.perf_counter() - t0:.1f}s")
    if missed:
        print("MISSED negative controls: " + ", ".join(missed))
    return 1 if violations or missed else 0


if __name__ == "__main__":
    sys.exit(main())
