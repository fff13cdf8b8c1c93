"""The store scenario of ``just fuzz`` (``fault_injection.fuzz``): writer and reader
processes of one pool, killed and paused at random, checked against their ack logs.

On a real directory (and on a JuiceFS mount,
two clients of one volume, when one can be mounted):

* N writer processes (distinct ``writer_id``) publish random-size publications in a loop
  (single publications and ``publish_many`` batches with index and ref dependencies).
  Publication number ``seq`` of a writer has submission id ``<writer>-<seq>`` and content
  generated from the payload seed ``<seed>:<writer>:<seq>``.  AFTER ``publish`` returned,
  the writer appends ``{sid, seq, payload_seed, refs}`` to its own fsynced ``AckLog``.  A
  restarted writer continues after the last acknowledged ``seq``: it first retries the
  one that was in flight when it died, with the same content, so D7 is exercised too.
* Writers fork mid-run (after the first submission of every incarnation, then now
  and then): the forked child first tries the inherited
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

"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import random
import signal
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from fault_injection.procs import (
    Proc,
    logged_violations,
    orphaned,
    report,
    stop_all,
    until_unlocked,
    wait_all,
)
from fault_injection.store_acks import (
    Retention,
    RetentionLog,
    check_read,
    content,
    entry_dep,
    entry_refs,
    writer_ids,
)
from straw import (
    ForkedProcess,
    InvalidReference,
    SharedFilesystemStore,
    StorageUnavailable,
)
from straw.fs import PosixFS
from straw.publication_log import AckLog

RUN = "fuzz"
READER_STATUS = "reader.status.json"
FORKS = "forks"  # in logdir: one <writer id>.alive per forked child, flocked while it lives
FORK_RATE = 0.01  # per submission of an original writer (besides its first)
FORK_BUDGET = (1, 4)  # submissions a forked child publishes before it exits


# --- writer process -------------------------------------------------------------------------

_stop = False


def _on_term(_sig: int, _frame: object) -> None:
    global _stop
    _stop = True


def _open_store(root: str, writer_id: str, run: str = RUN) -> SharedFilesystemStore:
    store = SharedFilesystemStore(root, run, writer_id=writer_id, reserve_bytes=4 << 20,
                                  segment_target_bytes=16 << 20)
    until_unlocked(lambda: store.lookup_submission("-"))  # take the writer lock now
    return store


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
        while (not _stop or must_publish) and not orphaned() and \
                (budget is None or budget > 0):
            must_publish = False
            if budget is not None:
                budget -= 1
            payload_seed = f"{seed}:{writer_id}:{seq}"
            sid = f"{writer_id}-{seq}"
            pubs = content(payload_seed, entry_dep(by_seq, seq))
            refs = store.publish_many(pubs, submission_id=sid)
            entry = {"sid": sid, "seq": seq, "payload_seed": payload_seed,
                     "refs": [x.to_dict() for x in refs]}
            log.append(entry)  # acknowledged: publish returned, now it is on record
            by_seq[seq] = entry
            seq += 1
            time.sleep(r.random() * 0.004)  # leave the shared machine some room
            after = _random_op(store, by_seq, ret, r, root, logdir, writer_id, run)
            if after is None:
                return 3
            store = after
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
        report(logdir, writer_id, "writer raised:\n" + traceback.format_exc())
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


def _random_op(store: SharedFilesystemStore, by_seq: dict[int, dict[str, Any]],
               ret: Retention | None, r: random.Random, root: str, logdir: str,
               writer_id: str, run: str) -> SharedFilesystemStore | None:
    """Now and then, after a submission: a lookup and a retry of an earlier one (which
    must return the acknowledged refs), a seal, or a clean in-process restart.  Returns
    the store to go on with, None after reporting a violation."""
    x = r.random()
    # reclaimable (released) submissions have no lookup or retry to check
    kept = sorted(by_seq) if ret is None else [
        s for s in sorted(by_seq) if s not in ret.unstaged]
    if x < 0.05 and len(kept) > 1:  # an earlier submission: lookup and retry
        old = by_seq[r.choice(kept)]
        want = entry_refs(old)
        got = store.lookup_submission(old["sid"])
        again = store.publish_many(
            content(old["payload_seed"], entry_dep(by_seq, old["seq"])),
            submission_id=old["sid"])
        if got != want or again != want:
            report(logdir, writer_id, f"{old['sid']}: acknowledged {want}, "
                    f"lookup {got}, retry {again}")
            return None
    elif x < 0.07:
        store.seal()
    elif x < 0.08:  # a clean in-process restart
        store.close()
        store = _open_store(root, writer_id, run)
    return store


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
            report(logdir, f"{writer_id}.f{seq}", "forked child raised:\n"
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
        "read": lambda: store.read(entry_refs(last)[0]) if last else store.seal(),
        "close": store.close,  # refused too; touches nothing of the parent's
    }
    for name, call in inherited.items():
        try:
            call()
        except ForkedProcess:
            continue
        except Exception as exc:
            report(logdir, child_id, f"inherited store: {name} raised {exc!r}, not "
                    "ForkedProcess")
            return 4
        report(logdir, child_id, f"inherited store: {name} worked in the forked child")
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
            report(logdir, writer_id, f"forked child {pid} ended with rc={rc}")


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
        while not _stop and not orphaned():
            for w in writer_ids(acks, writers):
                verified.setdefault(w, 0)
                entries = AckLog(PosixFS(), os.path.join(acks, f"acks-{w}.log")).read()
                by_seq = {e["seq"]: e for e in entries}
                for e in entries[verified[w]:]:
                    if _stop:
                        break
                    try:
                        pubs = content(e["payload_seed"], entry_dep(by_seq, e["seq"]))
                        if retention:  # a pin protects what we read from collection
                            with store.pin(entry_refs(e)):
                                check_read(store, entry_refs(e), pubs)
                        else:
                            check_read(store, entry_refs(e), pubs)
                    except InvalidReference as exc:
                        if retention and e["seq"] in RetentionLog.read(acks, w).unstaged:
                            verified[w] += 1  # passed over: released and reclaimed first
                            continue
                        report(logdir, "reader", f"{e['sid']}: {type(exc).__name__}: {exc}")
                        return 3
                    except StorageUnavailable:
                        lagging += 1  # visibility lag on another client: retried later
                        break
                    except Exception as exc:
                        report(logdir, "reader", f"{e['sid']}: {type(exc).__name__}: {exc}")
                        return 3
                    verified[w] += 1
            save()
            time.sleep(0.05)
    except Exception:
        report(logdir, "reader", "reader raised:\n" + traceback.format_exc())
        return 2
    finally:
        save()
        store.close()
    return 0


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


def _role_argv(role: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "fault_injection.store_fuzz", "--role", role, *args]


def _unsettle(s: Summary, rng: random.Random, writers: dict[str, Proc], reader: Proc,
              seconds: float, pace: float) -> None:
    """The supervisor's seeded actions for ``seconds``: writers SIGKILLed (some while
    paused) and restarted, writers and the reader paused and resumed; a process that
    exited on its own is a violation (and restarted)."""
    names = list(writers)
    everyone = [*writers.values(), reader]
    t_end = time.monotonic() + seconds
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
    writers = {w: Proc(w, writer_argv(w), logdir) for w in names}
    reader = Proc("reader", _role_argv("reader", "--root", read_root, "--acks", acks_r,
                                        "--logdir", logdir, "--writer-ids", ",".join(names),
                                        *run_args),
                   logdir)
    everyone = [*writers.values(), reader]
    try:
        _unsettle(s, rng, writers, reader, seconds, pace)
    finally:
        s.violations += stop_all(everyone)
        s.forks, late = _wait_for_forked_children(logdir)
        s.violations += late
    if retention:  # the job's clean end, in fresh processes (a SIGTERM may come too early)
        s.violations += wait_all([Proc(f"{w}-finish", writer_argv(w, "--finish"), logdir)
                                   for w in names], timeout=120)
    s.violations += logged_violations(logdir)
    try:
        with open(os.path.join(logdir, READER_STATUS)) as f:
            s.reader_verified = json.load(f)["verified"]
    except (OSError, ValueError):
        pass
    if before_check is not None:
        before_check()
    check(read_root, acks_r, writer_ids(acks_r, names), s, run=run, retention=retention)
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
                refs = entry_refs(e)
                pubs = content(e["payload_seed"], entry_dep(by_seq, seq))
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
        return frozenset((r.path, r.offset) for q in seqs for r in entry_refs(by_seq[q]))

    allowed = {extents(w): w for w in ret.windows()}
    if roots not in allowed:
        s.violations.append(f"checker: owner {owner!r} of run {store.run_id!r} holds {roots}; "
                            f"its last retains were {ret.windows()}")
        return ret.unstaged
    for q in allowed[roots] or ():
        e = by_seq[q]
        try:
            s.bytes_verified += check_read(store, entry_refs(e), content(
                e["payload_seed"], entry_dep(by_seq, q)))
            s.retained_verified += 1
        except Exception as exc:
            s.violations.append(f"checker: retained {e['sid']} of run {store.run_id!r}: "
                                f"{type(exc).__name__}: {exc}")
            break  # one is enough (and each costs the visibility retries)
    return ret.unstaged


def role_main(argv: Sequence[str] | None = None) -> int:
    """A child process of the scenario: ``--role writer`` or ``--role reader``."""
    ap = argparse.ArgumentParser(prog="python -m fault_injection.store_fuzz")
    ap.add_argument("--role", choices=("writer", "reader"), required=True)
    for name in ("--root", "--acks", "--logdir", "--writer-id", "--writer-ids", "--control"):
        ap.add_argument(name)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--run", default=RUN)
    ap.add_argument("--retention", action="store_true")
    ap.add_argument("--finish", action="store_true")
    args = ap.parse_args(argv)
    if args.role == "writer":
        return writer_main(args.root, args.acks, args.logdir, args.writer_id, args.seed,
                           args.control, args.run, args.retention, args.finish)
    return reader_main(args.root, args.acks, args.logdir, args.writer_ids.split(","),
                       args.run, args.retention)


if __name__ == "__main__":
    sys.exit(role_main())
