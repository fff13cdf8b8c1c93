"""``just fuzz``: real processes on a real filesystem, killed and paused at random.

Role: verification layer 7 of DESIGN.md.  On a real directory (and on a JuiceFS mount,
two clients of one volume, when one can be mounted):

* N writer processes (distinct ``writer_id``) publish random-size publications in a loop
  (single publications and ``publish_many`` batches with index and ref dependencies).
  Publication number ``seq`` of a writer has submission id ``<writer>-<seq>`` and content
  generated from the payload seed ``<seed>:<writer>:<seq>``.  AFTER ``publish`` returned,
  the writer appends ``{sid, seq, payload_seed, refs}`` to its own fsynced ``AckLog``.  A
  restarted writer continues after the last acknowledged ``seq``: it first retries the
  one that was in flight when it died, with the same content, so D7 is exercised too.
* Writers fork mid-run (issue 11, finding 1; after the first submission of every
  incarnation, then now and then): the forked child first tries the inherited
  store (a publication, a lookup, a read) and must get ``ForkedProcess`` every time (else
  a violation); then it opens its own store under its own writer id
  (``<writer>.f<seq>``), publishes a few submissions and logs them in its own ack log like
  any writer, and exits; the parent goes on publishing with the store it forked with.  A
  child whose parent is killed stops at once (orphaned).  Each child holds an ``flock`` on
  ``<logdir>/forks/<id>.alive`` while it lives; the supervisor waits for all of them
  before checking.
* A reader process (on the other JuiceFS client) follows every writer's ack log (forked
  children's included, found by listing the ack directory) and verifies each
  acknowledged reference as it appears.
* A seeded supervisor sends random SIGKILL to writers (and restarts them with the same
  writer id) and SIGSTOP/SIGCONT to writers and the reader, for ``--seconds``.
* Afterwards the checker verifies every acknowledged reference (the bytes match the
  payload seed) and that each writer's ``lookup_submission`` of every acknowledged
  submission id returns the same refs, and a retry of it too (forked children's writer
  ids included: 0 lost, 0 acknowledged twice differently).

Prints a summary per filesystem (kills, stops, restarts, publications verified, seed) and
exits non-zero on any violation (a mismatch, an unexpected exception, a writer or reader
that died on its own).

With ``retention`` (the shared-root scenario, ``fault_injection.runs_fuzz``) each writer
also retains its latest acknowledged submissions under the owner ``keep-<writer>`` (a
name every run uses), then drops the staging of all it acknowledged (the older ones
become garbage), and collects garbage now and then and at its clean end (run in a fresh
process after the others stopped); it logs each step in ``ret-<writer>.log`` (the intent
before, the retain after), so the checker knows which submissions may be reclaimed and
which roots the owner must hold.  The reader pins what it reads, and passes over what
was released and reclaimed before it got to it.

``--scenario`` picks the store scenario above, the queue scenarios
(``fault_injection.queue_fuzz``: a coordinator process and worker processes, SIGKILLed,
SIGSTOPped and taken over, checked against the workers' receipt logs; on the local
directory and on JuiceFS, coordinators alternating between the two clients and
``--queue-seconds`` split between the filesystems; ``--no-queue-juicefs`` keeps them on
the local directory), the shared-root scenario ``runs`` (``fault_injection.runs_fuzz``:
two runs in one root, each with retaining writers and a queue of the same id;
``--runs-seconds`` split between the filesystems), the rollout scenario ``rollout``
(``fault_injection.rollout_fuzz``: a rollout controller, generation processes and a
trainer, SIGKILLed and restarted; ``--rollout-seconds`` split between the filesystems),
the whole-job scenario ``job`` (``fault_injection.job_fuzz``: one checkpointed rollout job
SIGKILLed and resumed through ``resolve_checkpoint`` + ``open_job``; ``--job-seconds``
split between the filesystems) or ``all`` (the default).  ``--juicefs no`` skips JuiceFS for all.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from straw import (
    ForkedProcess,
    InvalidReference,
    Publication,
    Record,
    RecordSetRef,
    SharedFilesystemStore,
    StorageUnavailable,
    UnsafeRecovery,
)
from straw.fs import PosixFS
from straw.publication_log import AckLog

if TYPE_CHECKING:
    from fault_injection.job_fuzz import JobSummary
    from fault_injection.queue_fuzz import QueueSummary
    from fault_injection.rollout_fuzz import RolloutSummary
    from fault_injection.runs_fuzz import RunsSummary

RUN = "fuzz"
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
T = TypeVar("T")
READER_STATUS = "reader.status.json"
VIOLATIONS = "violations.jsonl"
FORKS = "forks"  # in logdir: one <writer id>.alive per forked child, flocked while it lives
FORK_RATE = 0.01  # per submission of an original writer (besides its first)
FORK_BUDGET = (1, 4)  # submissions a forked child publishes before it exits


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


def _entry_refs(entry: dict[str, Any]) -> tuple[RecordSetRef, ...]:
    # a tuple, as publish_many and lookup_submission return them
    return tuple(RecordSetRef.from_dict(d) for d in entry["refs"])


def _entry_dep(entries_by_seq: dict[int, dict[str, Any]], seq: int) -> RecordSetRef | None:
    prev = entries_by_seq.get(seq - 1)
    return _entry_refs(prev)[0] if prev else None


def _report(logdir: str, who: str, message: str) -> None:
    with open(os.path.join(logdir, VIOLATIONS), "a") as f:
        f.write(json.dumps({"who": who, "message": message}) + "\n")
        f.flush()
        os.fsync(f.fileno())


# --- writer process -------------------------------------------------------------------------

_stop = False


def _on_term(_sig: int, _frame: object) -> None:
    global _stop
    _stop = True


_PARENT = os.getppid()


def _orphaned() -> bool:
    """The supervisor is gone: stop instead of running on forever."""
    return os.getppid() != _PARENT


def _until_unlocked(open_: Callable[[], T]) -> T:
    """``open_()``, retried for up to 30 s while it raises ``UnsafeRecovery``: a killed
    predecessor's lock may take a moment to go away on a network filesystem.  (Also used
    by ``fault_injection.queue_fuzz``.)"""
    deadline = time.monotonic() + 30
    while True:
        try:
            return open_()
        except UnsafeRecovery:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _open_store(root: str, writer_id: str, run: str = RUN) -> SharedFilesystemStore:
    store = SharedFilesystemStore(root, run, writer_id=writer_id, reserve_bytes=4 << 20,
                                  segment_target_bytes=16 << 20)
    _until_unlocked(lambda: store.lookup_submission("-"))  # take the writer lock now
    return store


# --- retention (the shared-root scenario) -------------------------------------------------

RETAIN_WINDOW = 4  # the latest acknowledged submissions a writer's owner holds


def _ret_log(acks: str, writer_id: str) -> AckLog:
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
        for e in _ret_log(acks, writer_id).read():
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
        self.log = _ret_log(acks, writer_id)
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
        store.retain(self.owner, [ref for q in window for ref in _entry_refs(by_seq[q])])
        self.log.append({"kind": "retain", "seqs": window})
        staged = [q for q in sorted(by_seq) if q not in self.unstaged]
        self.log.append({"kind": "unstage-intent", "seqs": staged})
        self.unstaged.update(staged)
        store.release_publications([ref for q in staged for ref in _entry_refs(by_seq[q])])

    def finish(self, store: SharedFilesystemStore, by_seq: dict[int, dict[str, Any]]) -> None:
        """A job's clean end (SIGTERM): seal, retain the last window, collect."""
        store.seal()
        if by_seq:
            self.retain(store, by_seq)
        store.collect_garbage()

    def close(self) -> None:
        self.log.close()


def writer_main(root: str, acks: str, logdir: str, writer_id: str, seed: int,
                control: str | None = None, run: str = RUN, retention: bool = False,
                finish: bool = False) -> int:
    """``finish``: only the job's clean end (with ``retention``): publish once, retain the
    last window, collect, exit."""
    global _stop
    signal.signal(signal.SIGTERM, _on_term)
    _stop = _stop or finish
    if control:  # a negative control: a deliberately broken engine in this writer
        from fault_injection.controls import RUNS_CONTROLS, STORE_CONTROLS
        with {**STORE_CONTROLS, **RUNS_CONTROLS}[control]():
            return _writer_loop(root, acks, logdir, writer_id, seed, run, retention)
    return _writer_loop(root, acks, logdir, writer_id, seed, run, retention)


def _writer_loop(root: str, acks: str, logdir: str, writer_id: str, seed: int,
                 run: str = RUN, retention: bool = False, budget: int | None = None) -> int:
    """Publish until stopped (``budget``: at most that many submissions; a forked child).
    An original writer (no budget) of the plain scenario forks children now and then
    (``_fork_child``); a retaining writer (the shared-root scenario) does not fork."""
    log = AckLog(PosixFS(), os.path.join(acks, f"acks-{writer_id}.log"))
    by_seq = {e["seq"]: e for e in log.read()}
    seq = max(by_seq, default=-1) + 1
    ret = Retention(acks, writer_id) if retention else None
    store = _open_store(root, writer_id, run)
    r = random.Random(f"{seed}:{writer_id}:{seq}:ops")
    # a retaining writer publishes at least once per process: the retry of what was in
    # flight when its predecessor died is acknowledged (else it stays staged for good)
    must_publish = ret is not None
    children: list[int] = []
    done = 0  # submissions of this incarnation
    try:
        while (not _stop or must_publish) and not _orphaned() and \
                (budget is None or budget > 0):
            must_publish = False
            if budget is not None:
                budget -= 1
            payload_seed = f"{seed}:{writer_id}:{seq}"
            sid = f"{writer_id}-{seq}"
            pubs = content(payload_seed, _entry_dep(by_seq, seq))
            refs = store.publish_many(pubs, submission_id=sid)
            entry = {"sid": sid, "seq": seq, "payload_seed": payload_seed,
                     "refs": [x.to_dict() for x in refs]}
            log.append(entry)  # acknowledged: publish returned, now it is on record
            by_seq[seq] = entry
            seq += 1
            time.sleep(r.random() * 0.004)  # leave the shared machine some room
            x = r.random()
            # reclaimable (released) submissions have no lookup or retry to check
            kept = sorted(by_seq) if ret is None else [
                s for s in sorted(by_seq) if s not in ret.unstaged]
            if x < 0.05 and len(kept) > 1:  # an earlier submission: lookup and retry
                old = by_seq[r.choice(kept)]
                want = _entry_refs(old)
                got = store.lookup_submission(old["sid"])
                again = store.publish_many(
                    content(old["payload_seed"], _entry_dep(by_seq, old["seq"])),
                    submission_id=old["sid"])
                if got != want or again != want:
                    _report(logdir, writer_id, f"{old['sid']}: acknowledged {want}, "
                            f"lookup {got}, retry {again}")
                    return 3
            elif x < 0.07:
                store.seal()
            elif x < 0.08:  # a clean in-process restart
                store.close()
                store = _open_store(root, writer_id, run)
            if ret is not None:
                ret.step(store, by_seq, r)
            done += 1
            # an original writer forks after its first submission (with a pack open and
            # its lock held; so that every run forks), then at random
            if budget is None and ret is None and (done == 1 or r.random() < FORK_RATE):
                children.append(_fork_child(store, root, acks, logdir, writer_id, seed, seq,
                                            by_seq, run))
            _reap(children, logdir, writer_id, block=False)
        if ret is not None and _stop:
            ret.finish(store, by_seq)
    except Exception:
        _report(logdir, writer_id, "writer raised:\n" + traceback.format_exc())
        return 2
    finally:
        if not store.closed:
            store.close()
        log.close()
        if ret is not None:
            ret.close()
        for pid in children:  # stop the forked children (they finish their submission)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        _reap(children, logdir, writer_id, block=True)
    return 0


def _fork_child(store: SharedFilesystemStore, root: str, acks: str, logdir: str,
                writer_id: str, seed: int, seq: int, by_seq: dict[int, dict[str, Any]],
                run: str = RUN) -> int:
    """Fork; the child checks that the inherited store refuses, then publishes as writer
    ``<writer_id>.f<seq>`` (its own store, its own ack log) and exits.  Returns its pid."""
    pid = os.fork()
    if pid:
        return pid
    code = 5
    try:
        code = _forked_child_main(store, root, acks, logdir, writer_id, seed, seq, by_seq,
                                  run)
    except BaseException:  # noqa: BLE001 - the child must never return into the parent's loop
        with contextlib.suppress(Exception):
            _report(logdir, f"{writer_id}.f{seq}", "forked child raised:\n"
                    + traceback.format_exc())
    finally:
        os._exit(code)


def _forked_child_main(store: SharedFilesystemStore, root: str, acks: str, logdir: str,
                       writer_id: str, seed: int, seq: int,
                       by_seq: dict[int, dict[str, Any]], run: str = RUN) -> int:
    global _PARENT
    _PARENT = os.getppid()  # orphaned = the writer that forked us is gone
    child_id = f"{writer_id}.f{seq}"
    os.makedirs(os.path.join(logdir, FORKS), exist_ok=True)
    alive = open(os.path.join(logdir, FORKS, f"{child_id}.alive"), "a")  # noqa: SIM115
    fcntl.flock(alive, fcntl.LOCK_EX)  # held until this process is gone, however it ends
    last = by_seq.get(max(by_seq)) if by_seq else None
    inherited = {
        "publish": lambda: store.publish_many(content(f"{seed}:{child_id}:inherited", None),
                                              submission_id=f"{child_id}-inherited"),
        "lookup_submission": lambda: store.lookup_submission(f"{writer_id}-0"),
        "read": lambda: store.read(_entry_refs(last)[0]) if last else store.seal(),
        "close": store.close,  # refused too; touches nothing of the parent's
    }
    for name, call in inherited.items():
        try:
            call()
        except ForkedProcess:
            continue
        except Exception as exc:
            _report(logdir, child_id, f"inherited store: {name} raised {exc!r}, not "
                    "ForkedProcess")
            return 4
        _report(logdir, child_id, f"inherited store: {name} worked in the forked child")
        return 4
    budget = random.Random(f"{seed}:{child_id}:budget").randint(*FORK_BUDGET)
    return _writer_loop(root, acks, logdir, child_id, seed, run, budget=budget)


def _reap(children: list[int], logdir: str, writer_id: str, *, block: bool) -> None:
    """Collect finished forked children; one that failed is a violation."""
    for pid in list(children):
        try:
            done, status = os.waitpid(pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            children.remove(pid)
            continue
        if not done:
            continue
        children.remove(pid)
        rc = os.waitstatus_to_exitcode(status)
        if rc not in (0, -signal.SIGTERM):
            _report(logdir, writer_id, f"forked child {pid} ended with rc={rc}")


# --- reader process -------------------------------------------------------------------------

def reader_main(root: str, acks: str, logdir: str, writers: Sequence[str], run: str = RUN,
                retention: bool = False) -> int:
    signal.signal(signal.SIGTERM, _on_term)
    store = SharedFilesystemStore(root, run, writer_id="reader")  # reads only: no lock
    verified: dict[str, int] = dict.fromkeys(writers, 0)
    lagging = 0
    status = os.path.join(logdir, READER_STATUS)

    def save() -> None:
        tmp = status + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"verified": sum(verified.values()), "lagging": lagging}, f)
        os.replace(tmp, status)

    try:
        while not _stop and not _orphaned():
            for w in _writer_ids(acks, writers):
                verified.setdefault(w, 0)
                entries = AckLog(PosixFS(), os.path.join(acks, f"acks-{w}.log")).read()
                by_seq = {e["seq"]: e for e in entries}
                for e in entries[verified[w]:]:
                    if _stop:
                        break
                    try:
                        pubs = content(e["payload_seed"], _entry_dep(by_seq, e["seq"]))
                        if retention:  # a pin protects what we read from collection
                            with store.pin(_entry_refs(e)):
                                check_read(store, _entry_refs(e), pubs)
                        else:
                            check_read(store, _entry_refs(e), pubs)
                    except InvalidReference as exc:
                        if retention and e["seq"] in RetentionLog.read(acks, w).unstaged:
                            verified[w] += 1  # passed over: released and reclaimed first
                            continue
                        _report(logdir, "reader", f"{e['sid']}: {type(exc).__name__}: {exc}")
                        return 3
                    except StorageUnavailable:
                        lagging += 1  # visibility lag on another client: retried later
                        break
                    except Exception as exc:
                        _report(logdir, "reader", f"{e['sid']}: {type(exc).__name__}: {exc}")
                        return 3
                    verified[w] += 1
            save()
            time.sleep(0.05)
    except Exception:
        _report(logdir, "reader", "reader raised:\n" + traceback.format_exc())
        return 2
    finally:
        save()
        store.close()
    return 0


def _writer_ids(acks: str, writers: Sequence[str]) -> list[str]:
    """The original writers and every forked child that logged an acknowledgement."""
    found = set(writers)
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir(acks):
            if name.startswith("acks-") and name.endswith(".log"):
                found.add(name[len("acks-"):-len(".log")])
    return sorted(found)


def _wait_for_forked_children(logdir: str, timeout: float = 60.0) -> tuple[int, list[str]]:
    """Wait until every forked child is gone (each held the flock of its alive file);
    returns how many there were, and a violation per child still alive at ``timeout``."""
    d = os.path.join(logdir, FORKS)
    names = sorted(os.listdir(d)) if os.path.isdir(d) else []
    deadline = time.monotonic() + timeout
    late = []
    for name in names:
        with open(os.path.join(d, name), "a") as f:
            while True:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        late.append(f"forked child {name} still runs {timeout:.0f} s after "
                                    "the run")
                        break
                    time.sleep(0.05)
    return len(names), late


# --- supervisor -----------------------------------------------------------------------------

@dataclass
class Summary:
    target: str
    seed: int
    seconds: float
    writers: int
    forks: int = 0
    kills: int = 0
    stops: int = 0
    restarts: int = 0
    submissions: int = 0
    publications: int = 0
    bytes_verified: int = 0
    retries_checked: int = 0
    reader_verified: int = 0
    retained_verified: int = 0  # submissions of the owners' final windows (retention)
    violations: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"fuzz [{self.target}] seed={self.seed} {self.seconds:.0f}s, "
                f"{self.writers} writers: {self.kills} kills, {self.stops} stops, "
                f"{self.restarts} restarts, {self.forks} forked children; "
                f"{self.submissions} acknowledged submissions = "
                f"{self.publications} publications ({self.bytes_verified / 1e6:.1f} MB) "
                f"verified by the checker, {self.retries_checked} lookups+retries checked, "
                f"{self.reader_verified} verified live by the reader; "
                f"{len(self.violations)} violations")


class _Proc:
    def __init__(self, name: str, argv: list[str], logdir: str) -> None:
        self.name = name
        self.argv = argv
        self.logpath = os.path.join(logdir, f"{name}.stderr")
        self.p: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (_REPO, env.get("PYTHONPATH", "")) if p)
        with open(self.logpath, "ab") as err:
            self.p = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=err,
                                      cwd=_REPO, env=env)

    @property
    def pid(self) -> int:
        assert self.p is not None
        return self.p.pid

    def tail(self) -> str:
        try:
            with open(self.logpath, errors="replace") as f:
                return "".join(f.readlines()[-15:])
        except OSError:
            return ""


def _stop_all(procs: Sequence[_Proc]) -> list[str]:
    """SIGCONT and SIGTERM every process still running, then wait for each (SIGKILL after
    60 s).  Returns violations: a process that did not stop, or ended with another status
    than 0 or SIGTERM.  (Also used by ``fault_injection.queue_fuzz``.)"""
    violations = []
    for proc in procs:
        assert proc.p is not None
        if proc.p.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.p.send_signal(signal.SIGTERM)
    for proc in procs:
        assert proc.p is not None
        try:
            rc = proc.p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.p.kill()
            rc = proc.p.wait()
            violations.append(f"{proc.name} did not stop within 60 s of SIGTERM")
        if rc not in (0, -signal.SIGTERM):
            violations.append(f"{proc.name} ended with rc={rc}:\n{proc.tail()}")
    return violations


def _wait_all(procs: Sequence[_Proc], timeout: float) -> list[str]:
    """Wait for processes that end by themselves; violations: a status other than 0, or
    still running after ``timeout`` seconds (then SIGKILLed)."""
    violations = []
    for proc in procs:
        assert proc.p is not None
        try:
            rc = proc.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.p.kill()
            rc = proc.p.wait()
            violations.append(f"{proc.name} did not end within {timeout:.0f} s")
        if rc != 0:
            violations.append(f"{proc.name} ended with rc={rc}:\n{proc.tail()}")
    return violations


def _logged_violations(logdir: str) -> list[str]:
    """What the processes reported with ``_report`` in ``logdir``."""
    vpath = os.path.join(logdir, VIOLATIONS)
    if not os.path.exists(vpath):
        return []
    with open(vpath) as f:
        return [json.loads(line)["who"] + ": " + json.loads(line)["message"]
                for line in f if line.strip()]


def _role_argv(role: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "fault_injection.fuzz", "--role", role, *args]


def run_target(target: str, write_base: str, read_base: str, logdir: str, *,
               seconds: float, n_writers: int, seed: int, control: str | None = None,
               run: str = RUN, pools: tuple[str, str] | None = None,
               retention: bool = False, pace: float = 1.0,
               before_check: Callable[[], object] | None = None) -> Summary:
    """One fuzz run.  ``write_base`` and ``read_base`` name the same directory as seen by
    the writers and by the reader/checker (two JuiceFS clients, or the same path);
    ``logdir`` is local (process logs, reported violations, reader status).  ``pools``:
    the pool root as seen by the writers and by the reader/checker, if not under the bases
    (runs sharing a root); ``run``: the run id; ``retention``: see the module docstring;
    ``pace`` stretches the time between the supervisor's actions (a busier machine);
    ``before_check`` is called after every process ended, before the checker runs."""
    write_root, read_root = pools or (os.path.join(write_base, "pool"),
                                      os.path.join(read_base, "pool"))
    run_args = ("--run", run, *(("--retention",) if retention else ()))

    def writer_argv(w: str, *extra: str) -> list[str]:
        return _role_argv("writer", "--root", write_root, "--acks", acks_w, "--logdir",
                          logdir, "--writer-id", w, "--seed", str(seed), *run_args, *extra,
                          *(("--control", control) if control else ()))

    acks_w, acks_r = os.path.join(write_base, "acks"), os.path.join(read_base, "acks")
    os.makedirs(acks_w, exist_ok=True)
    os.makedirs(logdir, exist_ok=True)
    s = Summary(target, seed, seconds, n_writers)
    rng = random.Random(seed)
    names = [f"w{i}" for i in range(n_writers)]
    writers = {w: _Proc(w, writer_argv(w), logdir) for w in names}
    reader = _Proc("reader", _role_argv("reader", "--root", read_root, "--acks", acks_r,
                                        "--logdir", logdir, "--writer-ids", ",".join(names),
                                        *run_args),
                   logdir)
    everyone = [*writers.values(), reader]
    t_end = time.monotonic() + seconds
    try:
        while time.monotonic() < t_end:
            time.sleep(rng.uniform(0.1, 0.6) * pace)
            for proc in everyone:
                assert proc.p is not None
                rc = proc.p.poll()
                if rc is not None:
                    s.violations.append(f"{proc.name} exited on its own (rc={rc}):\n"
                                        f"{proc.tail()}")
                    proc.start()
                    s.restarts += 1
            action = rng.choices(["kill", "stop", "stop-reader", "kill-stopped", "none"],
                                 weights=[5, 3, 1, 1, 2])[0]
            w = writers[rng.choice(names)]
            if action == "kill":
                os.kill(w.pid, signal.SIGKILL)
            elif action == "kill-stopped":  # paused, then killed without resuming
                os.kill(w.pid, signal.SIGSTOP)
                s.stops += 1
                time.sleep(rng.uniform(0.0, 0.2))
                os.kill(w.pid, signal.SIGKILL)
            if action in ("kill", "kill-stopped"):
                assert w.p is not None
                w.p.wait()
                s.kills += 1
                w.start()
                s.restarts += 1
            elif action in ("stop", "stop-reader"):
                victim = reader if action == "stop-reader" else w
                os.kill(victim.pid, signal.SIGSTOP)
                time.sleep(rng.uniform(0.05, 0.8))
                os.kill(victim.pid, signal.SIGCONT)
                s.stops += 1
    finally:
        s.violations += _stop_all(everyone)
        s.forks, late = _wait_for_forked_children(logdir)
        s.violations += late
    if retention:  # the job's clean end, in fresh processes (a SIGTERM may come too early)
        s.violations += _wait_all([_Proc(f"{w}-finish", writer_argv(w, "--finish"), logdir)
                                   for w in names], timeout=120)
    s.violations += _logged_violations(logdir)
    try:
        with open(os.path.join(logdir, READER_STATUS)) as f:
            s.reader_verified = json.load(f)["verified"]
    except (OSError, ValueError):
        pass
    if before_check is not None:
        before_check()
    check(read_root, acks_r, _writer_ids(acks_r, names), s, run=run, retention=retention)
    return s


def check(root: str, acks: str, writers: Sequence[str], s: Summary, *, run: str = RUN,
          retention: bool = False) -> None:
    """Every acknowledged reference reads back as its payload seed says; each writer's
    lookup (and a retry) of every acknowledged submission returns the same refs.  With
    ``retention``, submissions whose staging was dropped are exempt, and instead each
    writer's owner holds exactly its last retained window, which reads back."""
    for w in writers:
        entries = AckLog(PosixFS(), os.path.join(acks, f"acks-{w}.log")).read()
        by_seq: dict[int, dict[str, Any]] = {}
        for e in entries:
            prev = by_seq.get(e["seq"])
            if prev is not None and prev["refs"] != e["refs"]:
                s.violations.append(f"{e['sid']} acknowledged twice with different refs")
            by_seq[e["seq"]] = e
        try:
            store = SharedFilesystemStore(root, run, writer_id=w)
        except Exception as exc:
            s.violations.append(f"checker cannot open writer {w}: {exc!r}")
            continue
        exempt: set[int] = set()
        try:
            if retention:
                exempt = _check_retained(store, acks, w, by_seq, s)
            for seq in sorted(set(by_seq) - exempt):
                e = by_seq[seq]
                refs = _entry_refs(e)
                pubs = content(e["payload_seed"], _entry_dep(by_seq, seq))
                try:
                    s.bytes_verified += check_read(store, refs, pubs)
                    got = store.lookup_submission(e["sid"])
                    if got != refs:
                        raise AssertionError(f"lookup returned {got}, acknowledged {refs}")
                    again = store.publish_many(pubs, submission_id=e["sid"])
                    if again != refs:
                        raise AssertionError(f"retry returned {again}, acknowledged {refs}")
                except Exception as exc:
                    s.violations.append(f"checker: {e['sid']}: {type(exc).__name__}: {exc}")
                    continue
                s.submissions += 1
                s.publications += len(refs)
                s.retries_checked += 1
        finally:
            store.close()


def _check_retained(store: SharedFilesystemStore, acks: str, writer_id: str,
                    by_seq: dict[int, dict[str, Any]], s: Summary) -> set[int]:
    """The writer's owner holds the refs of its last completed retain or of a retain
    intended since (nothing of another run), and they read back.  Returns the submissions
    whose staging may have been dropped (not checked further)."""
    ret = RetentionLog.read(acks, writer_id)
    owner = f"keep-{writer_id}"
    store.collect_garbage()  # whatever the owner holds must survive one more collection
    with store.catalog.locked() as st:
        got = st.run_owners(store.run_id).get(owner)
    roots = None if got is None else frozenset(got)

    def extents(seqs: list[int] | None) -> frozenset[tuple[str, int]] | None:
        if seqs is None:
            return None
        return frozenset((r.path, r.offset) for q in seqs for r in _entry_refs(by_seq[q]))

    allowed = {extents(w): w for w in ret.windows()}
    if roots not in allowed:
        s.violations.append(f"checker: owner {owner!r} of run {store.run_id!r} holds {roots}; "
                            f"its last retains were {ret.windows()}")
        return ret.unstaged
    for q in allowed[roots] or ():
        e = by_seq[q]
        try:
            s.bytes_verified += check_read(store, _entry_refs(e), content(
                e["payload_seed"], _entry_dep(by_seq, q)))
            s.retained_verified += 1
        except Exception as exc:
            s.violations.append(f"checker: retained {e['sid']} of run {store.run_id!r}: "
                                f"{type(exc).__name__}: {exc}")
            break  # one is enough (and each costs the visibility retries)
    return ret.unstaged


@contextlib.contextmanager
def _juicefs(base: str) -> Iterator[tuple[str, str] | str]:
    """Two clients of a fresh JuiceFS volume, or the reason there are none."""
    try:
        from tests.juicefs_fixture import JuiceFSUnavailable, mount_pair
    except ImportError as e:  # pragma: no cover - run from outside the repository
        yield f"cannot import tests.juicefs_fixture: {e}"
        return
    try:
        with mount_pair(os.path.join(base, "juicefs")) as m:
            yield (m.a, m.b)
    except JuiceFSUnavailable as e:
        yield str(e)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fault_injection.fuzz",
                                 description="straw fuzz harness: real processes, SIGKILL, "
                                             "SIGSTOP/SIGCONT, checked against ack logs")
    ap.add_argument("--seconds", type=float, default=60.0, help="per filesystem")
    ap.add_argument("--writers", type=int, default=3)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--dir", default=None, help="work directory (default: a temp dir)")
    ap.add_argument("--juicefs", choices=("auto", "yes", "no"), default="auto",
                    help="also run on a JuiceFS mount (both scenarios): when available / "
                         "required / never")
    ap.add_argument("--keep", action="store_true", help="keep the pools and logs")
    ap.add_argument("--control", default=None,
                    help="negative control: run the writers on a deliberately broken engine "
                         "(a name from fault_injection.controls.STORE_CONTROLS), or the "
                         "coordinators of the queue scenarios (queue_campaign.QUEUE_CONTROLS, "
                         "e.g. queue-no-fencing), or the writers of the shared-root scenario "
                         "(controls.RUNS_CONTROLS, e.g. runs-share-owners), or the generation "
                         "processes of the rollout scenario (rollout_fuzz.CONTROLS, e.g. "
                         "rollout-restart-partial), or the job of the job scenario "
                         "(job_fuzz.CONTROLS, e.g. job-exact-resume); the run must then "
                         "report violations")
    ap.add_argument("--scenario", choices=("store", "queue", "runs", "rollout", "job", "all"),
                    default="all",
                    help="store: writer/reader processes (per filesystem); queue: a "
                         "coordinator process and worker processes, killed, paused and taken "
                         "over (fault_injection.queue_fuzz); runs: two runs in one root, each "
                         "with retaining writers and a queue of the same id "
                         "(fault_injection.runs_fuzz); rollout: a rollout job's controller, "
                         "generation and trainer processes (fault_injection.rollout_fuzz); "
                         "job: a whole checkpointed rollout job SIGKILLed and resumed from its "
                         "joint checkpoints (fault_injection.job_fuzz); all: all five")
    ap.add_argument("--queue-seconds", type=float, default=None,
                    help="total duration of the queue scenarios, split between the local "
                         "directory and JuiceFS when it runs (default: --seconds)")
    ap.add_argument("--queue-workers", type=int, default=3)
    ap.add_argument("--queue-juicefs", action=argparse.BooleanOptionalAction, default=True,
                    help="run the queue scenarios on JuiceFS too (coordinators alternating "
                         "between the two clients), unless --juicefs no; "
                         "--no-queue-juicefs keeps them on the local directory")
    ap.add_argument("--runs-seconds", type=float, default=None,
                    help="total duration of the shared-root scenario, split between the "
                         "local directory and JuiceFS when it runs (default: --seconds)")
    ap.add_argument("--runs-writers", type=int, default=2,
                    help="store writers (and queue workers) per run in the shared-root "
                         "scenario")
    ap.add_argument("--rollout-seconds", type=float, default=None,
                    help="total duration of the rollout scenario, split between the local "
                         "directory and JuiceFS when it runs (default: --seconds)")
    ap.add_argument("--job-seconds", type=float, default=None,
                    help="total duration of the job scenario, split between the local "
                         "directory and JuiceFS when it runs (default: --seconds)")
    ap.add_argument("--role", choices=("writer", "reader"), help=argparse.SUPPRESS)
    for hidden in ("--root", "--acks", "--logdir", "--writer-id", "--writer-ids"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    ap.add_argument("--run", default=RUN, help=argparse.SUPPRESS)
    ap.add_argument("--retention", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--finish", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.role == "writer":
        return writer_main(args.root, args.acks, args.logdir, args.writer_id, args.seed,
                           args.control, args.run, args.retention, args.finish)
    if args.role == "reader":
        return reader_main(args.root, args.acks, args.logdir, args.writer_ids.split(","),
                           args.run, args.retention)

    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    base = args.dir or tempfile.mkdtemp(prefix="straw-fuzz-")
    os.makedirs(base, exist_ok=True)
    summaries: list[Summary] = []
    queue_summaries: list[QueueSummary] = []
    notes: list[str] = []
    store_part = args.scenario in ("store", "all")
    store_control = args.control if args.control and not args.control.startswith(
        ("queue-", "runs-", "rollout-", "job-")) else None
    queue_part = args.scenario in ("queue", "all")
    queue_total = args.queue_seconds if args.queue_seconds is not None else args.seconds
    runs_part = args.scenario in ("runs", "all")
    runs_total = args.runs_seconds if args.runs_seconds is not None else args.seconds
    runs_summaries: list[RunsSummary] = []
    rollout_part = args.scenario in ("rollout", "all")
    rollout_total = args.rollout_seconds if args.rollout_seconds is not None else args.seconds
    rollout_summaries: list[RolloutSummary] = []
    job_part = args.scenario in ("job", "all")
    job_total = args.job_seconds if args.job_seconds is not None else args.seconds
    job_summaries: list[JobSummary] = []

    def run_queue_on(target: str, shared: tuple[str, str] | None, seconds: float) -> None:
        from fault_injection.queue_campaign import QUEUE_CONTROLS
        from fault_injection.queue_fuzz import run_queue
        qs = run_queue(os.path.join(base, f"queue-{target}"), seconds=seconds,
                       n_workers=args.queue_workers, seed=seed, shared=shared, target=target,
                       control=args.control if args.control in QUEUE_CONTROLS else None)
        queue_summaries.append(qs)
        print(qs.line(), flush=True)

    def run_runs_on(target: str, shared: tuple[str, str] | None, seconds: float) -> None:
        from fault_injection.controls import RUNS_CONTROLS
        from fault_injection.runs_fuzz import run_runs
        rs = run_runs(os.path.join(base, f"runs-{target}"), seconds=seconds,
                      n_writers=args.runs_writers, n_workers=args.runs_writers, seed=seed,
                      shared=shared, target=target,
                      control=args.control if args.control in RUNS_CONTROLS else None)
        runs_summaries.append(rs)
        print(rs.line(), flush=True)

    def run_rollout_on(target: str, shared: tuple[str, str] | None, seconds: float) -> None:
        from fault_injection.rollout_fuzz import CONTROLS, run_rollout
        rs = run_rollout(os.path.join(base, f"rollout-{target}"), seconds=seconds, seed=seed,
                         shared=shared, target=target,
                         control=args.control if args.control in CONTROLS else None)
        rollout_summaries.append(rs)
        print(rs.line(), flush=True)

    def run_job_on(target: str, mount: str | None, seconds: float) -> None:
        from fault_injection.job_fuzz import CONTROLS, run_job
        js = run_job(os.path.join(base, f"job-{target}"), seconds=seconds, seed=seed,
                     mount=mount, target=target,
                     control=args.control if args.control in CONTROLS else None)
        job_summaries.append(js)
        print(js.line(), flush=True)

    try:
        store_jfs = store_part and args.juicefs != "no"
        queue_jfs = queue_part and args.queue_juicefs and args.juicefs != "no"
        runs_jfs = runs_part and args.juicefs != "no"
        rollout_jfs = rollout_part and args.juicefs != "no"
        job_jfs = job_part and args.juicefs != "no"
        want_jfs = store_jfs or queue_jfs or runs_jfs or rollout_jfs or job_jfs
        mounting = _juicefs(base) if want_jfs else contextlib.nullcontext("")
        with mounting as mounts:
            # the queue and shared-root scenarios' time is split between the filesystems
            queue_jfs = queue_jfs and not isinstance(mounts, str)
            queue_seconds = queue_total / 2 if queue_jfs else queue_total
            runs_jfs = runs_jfs and not isinstance(mounts, str)
            runs_seconds = runs_total / 2 if runs_jfs else runs_total
            rollout_jfs = rollout_jfs and not isinstance(mounts, str)
            rollout_seconds = rollout_total / 2 if rollout_jfs else rollout_total
            job_jfs = job_jfs and not isinstance(mounts, str)
            job_seconds = job_total / 2 if job_jfs else job_total
            if store_part:
                local = os.path.join(base, "local")
                summaries.append(run_target("local", local, local,
                                            os.path.join(base, "logs-local"),
                                            seconds=args.seconds, n_writers=args.writers,
                                            seed=seed, control=store_control))
                print(summaries[-1].line(), flush=True)
            if queue_part:
                run_queue_on("local", None, queue_seconds)
            if runs_part:
                run_runs_on("local", None, runs_seconds)
            if rollout_part:
                run_rollout_on("local", None, rollout_seconds)
            if job_part:
                run_job_on("local", None, job_seconds)
            if isinstance(mounts, str):
                if want_jfs:
                    notes.append(f"JuiceFS skipped: {(mounts.splitlines() or [''])[0]}")
                    if args.juicefs == "yes":
                        print(notes[-1])
                        return 1
            else:
                a, b = mounts
                if store_jfs:
                    s = run_target("juicefs", a, b, os.path.join(base, "logs-juicefs"),
                                   seconds=args.seconds, n_writers=args.writers, seed=seed,
                                   control=store_control)
                    summaries.append(s)
                    print(s.line(), flush=True)
                if queue_jfs:
                    run_queue_on("juicefs", (a, b), queue_seconds)
                if runs_jfs:
                    run_runs_on("juicefs", (a, b), runs_seconds)
                if rollout_jfs:
                    run_rollout_on("juicefs", (a, b), rollout_seconds)
                if job_jfs:
                    # one client: the save directory records absolute paths of its mount
                    run_job_on("juicefs", a, job_seconds)
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(base, ignore_errors=True)
    for n in notes:
        print(n)
    bad = [v for s in summaries for v in s.violations]
    bad += [v for q in queue_summaries for v in q.violations]
    bad += [v for r in runs_summaries for v in r.all_violations()]
    bad += [v for r in rollout_summaries for v in r.violations]
    bad += [v for j in job_summaries for v in j.violations]
    for v in bad[:20]:
        print("VIOLATION " + v)
    queue_text = "".join(
        f", queue/{q.target}: {q.worker_kills + q.coordinator_kills} kills, "
        f"{q.worker_stops + q.coordinator_stops} stops, {q.takeovers} takeovers, "
        f"{q.receipts} receipts verified" for q in queue_summaries)
    queue_text += "".join(
        f", runs/{r.target}: {sum(s.retained_verified for s in r.stores)} retained "
        f"submissions and {sum(q.receipts for q in r.queues)} receipts verified in two runs"
        for r in runs_summaries)
    queue_text += "".join(
        f", rollout/{r.target}: {sum(r.kills.values())} kills, {r.batches} batches trained, "
        f"{r.completed} accepted groups checked" for r in rollout_summaries)
    queue_text += "".join(
        f", job/{j.target}: {j.kills} kills, {sum(j.starts.values())} starts, "
        f"{j.replayed} batches replayed, {j.accepted} accepted groups checked"
        for j in job_summaries)
    print(f"fuzz summary: seed={seed}, {len(summaries)} filesystem(s), "
          f"{sum(s.kills for s in summaries)} kills, {sum(s.stops for s in summaries)} stops, "
          f"{sum(s.restarts for s in summaries)} restarts, "
          f"{sum(s.publications for s in summaries)} acknowledged publications verified"
          f"{queue_text}, {len(bad)} violations"
          + (f"; files in {base}" if args.keep or args.dir else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
