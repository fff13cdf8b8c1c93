"""The filesystem contract straw relies on, one clause per function.

Each clause is a small function ``clause(env) -> Result`` over ``straw.fs.Filesystem``:
client A (``env.a``) and client B (``env.b``) are two views of one directory (two mounts
of one volume = two machines; without a peer both are the same local view).  Because the
clauses only use the ``Filesystem`` interface, the negative controls run each of them on a
SimFS/FaultyFS variant that breaks exactly that clause (``tests/test_qualify.py``).
The run's ``Env`` and the measuring helpers are in ``straw.qualify.env``; the three
staleness clauses in ``straw.qualify.windows``; ``CLAUSES`` (below) lists all, in run order.

Time comes from ``env.clock``; every wait is bounded by ``env.deadline`` (a window that
does not close within it fails its clause), so a run stays short.  Windows are measured by
polling every ``env.poll`` seconds: a figure is "seen after at most this long".

The clauses (what the engine relies on it for):

* ``exclusive_create``   O_EXCL across clients: one winner (pool marker, epoch files, D8)
* ``lock_exclusion``     flock excludes across clients and is handed over on unlock
                         (catalog lock, writer and coordinator locks, D8)
* ``lock_release_on_death``  a SIGKILLed holder's flock is released (a dead coordinator
                         or writer never blocks recovery forever)
* ``close_to_open``      bytes fsynced and closed on A are read by B's next open at once
                         (the catalog is replayed through a handle opened under its lock)
* ``rename_atomic``      rename replaces the name atomically (the same inode, never a mix
                         of versions) and B sees the new version within the window
* ``unlink_race``        unlinking a name another client removed fails with ENOENT, and
                         exactly one of two racing unlinks succeeds (GC on two clients, D3)
* ``attribute_staleness`` / ``entry_staleness`` / ``listing_staleness``  how long B's
                         stat sizes, name lookups and directory listings lag behind A
                         (p50/p99/max): the visibility retry window must cover them (D6)
* ``space_reservation``  posix_fallocate grows the file with zeros, or is refused (the
                         store then appends)
* ``large_offsets``      positional I/O beyond 2 and 4 GiB (64-bit pack offsets)
* ``full_filesystem``    a full filesystem fails writes with ENOSPC/EDQUOT and keeps what
                         was acknowledged (needs ``env.full``: a small filesystem)
* ``mount_options``      a JuiceFS mount's client settings are safe (no writeback, no
                         open cache, no readdir cache); other types: reported only
"""

from __future__ import annotations

import errno
import functools
import random
import struct
import threading
from collections.abc import Callable
from typing import Any

from ..backend import JUICEFS_FSTYPE, juicefs_settings, mount_of, read_juicefs_config
from ..errors import DeploymentMismatch
from .env import (
    FAIL,
    PASS,
    SKIP,
    Client,
    Env,
    HolderFactory,
    LockHolder,
    Result,
    append_file,
    both_orders,
    converge,
    race,
    read_file,
    remove,
    stat_size,
    verdict,
    window,
    window_verdict,
    write_file,
)
from .windows import attribute_staleness, entry_staleness, listing_staleness


# checks for converge/poll_batch: what client c sees of name n now
def _reads(c: Client, n: str, want: bytes) -> Callable[[], bool]:
    return lambda: read_file(c, n) == want

# --- the clauses --------------------------------------------------------------------------
def exclusive_create(env: Env) -> Result:
    violations = []
    for i in range(env.rounds):
        first, second = both_orders(env, i)
        n = env.name("excl")
        write_file(first, n, b"first", exclusive=True)
        try:
            write_file(second, n, b"second", exclusive=True)
            violations.append(f"{n}: both clients created it exclusively")
        except FileExistsError:
            pass
    races = max(2, env.rounds // 2)
    for _ in range(races):
        n = env.name("excl-race")
        out = race([functools.partial(write_file, c, n, b"x", exclusive=True)
                     for c in (env.a, env.b)])
        winners = sum(1 for r in out if not isinstance(r, BaseException))
        others = [r for r in out if isinstance(r, BaseException)
                  and not isinstance(r, FileExistsError)]
        if others:
            violations.append(f"{n}: racing exclusive create raised {others[0]!r}")
        elif winners != 1:
            violations.append(f"{n}: {winners} clients won a racing exclusive create")
    return verdict("exclusive_create", violations,
                    f"{env.rounds} + {races} racing creates: one winner each",
                    {"sequential": env.rounds, "races": races})


def lock_exclusion(env: Env) -> Result:
    violations: list[str] = []
    handovers: list[float | None] = []
    for i in range(max(2, env.rounds // 2)):
        first, second = both_orders(env, i)
        n = env.name("lock")
        write_file(env.a, n, b"lock")
        f1 = first.fs.open(first.path(n), write=True)
        f2 = second.fs.open(second.path(n), write=True)
        try:
            if not first.fs.lock(f1, blocking=False):
                violations.append(f"{n}: a fresh file's lock was refused")
                continue
            if second.fs.lock(f2, blocking=False):
                violations.append(f"{n}: both clients hold the exclusive lock")
                second.fs.unlock(f2)
            first.fs.unlock(f1)
            lag = converge(env, lambda: second.fs.lock(f2, blocking=False))  # noqa: B023
            handovers.append(lag)
            if lag is None:
                violations.append(f"{n}: the lock was not granted within {env.deadline:g} s "
                                  "of its release")
        finally:
            first.fs.close(f1)
            second.fs.close(f2)
    fig = {"handover": window(handovers)}
    return verdict("lock_exclusion", violations,
                    f"never both held; {len(handovers)} handovers",
                    fig)


def lock_release_on_death(env: Env) -> Result:
    if env.holder is None:
        return Result("lock_release_on_death", SKIP, "no way to start a holder process here")
    violations: list[str] = []
    delays: list[float | None] = []
    for _ in range(2):
        n = env.name("dead-holder")
        write_file(env.a, n, b"lock")
        holder = env.holder(env.a.path(n))
        fd = env.b.fs.open(env.b.path(n), write=True)
        try:
            if env.b.fs.lock(fd, blocking=False):
                violations.append(f"{n}: the lock was granted while another process held it")
                env.b.fs.unlock(fd)
            holder.kill()
            lag = converge(env, lambda: env.b.fs.lock(fd, blocking=False))  # noqa: B023
            delays.append(lag)
            if lag is None:
                violations.append(f"{n}: the lock of a SIGKILLed holder was still held after "
                                  f"{env.deadline:g} s")
        finally:
            env.b.fs.close(fd)
            holder.close()
    return verdict("lock_release_on_death", violations,
                    "released after SIGKILL", {"release": window(delays)})


def close_to_open(env: Env) -> Result:
    rng = env.rng("c2o")
    violations = []
    lags: list[float | None] = []
    for _ in range(env.rounds):
        n = env.name("c2o")
        first = rng.randbytes(rng.choice((1 << 10, 64 << 10, 1 << 20)))
        write_file(env.a, n, first)
        seen = read_file(env.b, n)
        more = rng.randbytes(rng.choice((512, 64 << 10)))
        append_file(env.a, n, more, len(first))  # B has read the file before: cached
        again = read_file(env.b, n)
        for label, got, want in (("new file", seen, first), ("append", again, first + more)):
            if got == want:
                lags.append(0.0)
                continue
            lag = converge(env, _reads(env.b, n, want))
            lags.append(lag)
            shown = "missing" if got is None else f"{len(got)} bytes"
            violations.append(f"{n} ({label}): B's open after A's fsync+close read {shown}, "
                              f"not the {len(want)} bytes written"
                              + (f" (right after {lag:.3f} s)" if lag is not None else ""))
    return verdict("close_to_open", violations,
                    f"{len(lags)} fsync+close on A: B's next open read all",
                    {"lag": window(lags)})


_VMAGIC = b"SQRV"


def _version(k: int) -> bytes:
    """Version k of the renamed file: self-describing, shorter as k grows (so an in-place
    copy would leave the previous version's tail behind)."""
    size = max(64, (64 << 10) - 997 * k)
    body = random.Random(k).randbytes(size - 16)
    return _VMAGIC + struct.pack("<IQ", k, size) + body


def _parse_version(data: bytes) -> int | None:
    """k if ``data`` is exactly version k, else None (torn, mixed or foreign)."""
    if len(data) < 16 or data[:4] != _VMAGIC:
        return None
    k, size = struct.unpack("<IQ", data[4:16])
    return k if len(data) == size and data == _version(k) else None


class _Renames:
    """Client A renames whole versions of one file over its name; client B reads the
    name and must see one whole version each time (never torn, mixed or missing)."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.target = env.name("rename")
        self.violations: list[str] = []
        self.stale_missing = 0

    def publish(self, k: int) -> None:
        a, target = self.env.a, self.target
        tmp = f"{target}.tmp{k}"
        write_file(a, tmp, _version(k))
        ino = a.fs.stat(a.path(tmp)).inode
        a.fs.rename(a.path(tmp), a.path(target))
        a.fs.fsync_dir(a.dir)
        if a.fs.stat(a.path(target)).inode != ino:
            self.violations.append(f"{target}: after rename the name holds another inode "
                                   "than the renamed file (copied, not renamed)")
        if a.fs.probe(a.path(tmp)):
            self.violations.append(f"{tmp}: the source name still exists after rename")

    def b_version(self) -> int | None | str:
        data = read_file(self.env.b, self.target)
        if data is None:
            return "missing"
        k = _parse_version(data)
        if k is None:
            self.violations.append(f"{self.target}: B read {len(data)} bytes that are no "
                                   "complete version (torn or mixed)")
        return k

    def one_by_one(self) -> list[float | None]:
        """Each version renamed while B holds the previous one: how long B takes to
        see it."""
        lags: list[float | None] = []
        self.publish(0)
        for k in range(1, self.env.rounds + 1):
            self.b_version()  # B resolves the name: its caches now hold version k-1
            self.publish(k)

            def sees_k(k: int = k) -> bool:
                got = self.b_version()
                if got == "missing":
                    self.stale_missing += 1
                return got == k

            lags.append(converge(self.env, sees_k))
        return lags

    def concurrently(self) -> int:
        """B keeps reading while A renames as fast as it can: the reads made."""
        reads, done = 0, threading.Event()
        errors: list[BaseException] = []

        def renamer() -> None:
            try:
                for k in range(self.env.rounds + 1, 3 * self.env.rounds + 1):
                    self.publish(k)
            except BaseException as e:  # noqa: B036 - reported below
                errors.append(e)
            finally:
                done.set()

        t = threading.Thread(target=renamer)
        t.start()
        while True:
            finished = done.is_set()
            if self.b_version() == "missing":
                self.stale_missing += 1
            reads += 1
            if finished:
                break
        t.join()
        if errors:
            self.violations.append(
                f"renaming while the other client reads raised {errors[0]!r}")
        return reads


def rename_atomic(env: Env) -> Result:
    r = _Renames(env)
    lags = r.one_by_one()
    reads = r.concurrently()
    fig: dict[str, Any] = {"visible": window(lags), "concurrent_reads": reads,
           "missing_reads": r.stale_missing}
    res = verdict("rename_atomic", r.violations, f"{3 * env.rounds} renames: every read one "
                   f"whole version ({reads} concurrent)", fig)
    if res.verdict == PASS and fig["visible"]["unconverged"]:
        return window_verdict("rename_atomic", env, lags, "renamed versions")
    return res


def unlink_race(env: Env) -> Result:
    violations = []
    for i in range(env.rounds):
        first, second = both_orders(env, i)
        n = env.name("unlink")
        write_file(env.a, n, b"x")
        stat_size(second, n)  # the second client has the name cached
        first.fs.unlink(first.path(n))
        try:
            second.fs.unlink(second.path(n))
            violations.append(f"{n}: unlinked by both clients in turn (the second found it)")
        except FileNotFoundError:
            pass
        except OSError as e:
            violations.append(f"{n}: unlinking a name the other client removed raised "
                              f"{errno.errorcode.get(e.errno or 0, e.errno)}, not ENOENT")
    races = max(2, env.rounds // 2)
    for _ in range(races):
        n = env.name("unlink-race")
        write_file(env.a, n, b"x")
        stat_size(env.b, n)
        out = race([functools.partial(c.fs.unlink, c.path(n)) for c in (env.a, env.b)])
        ok = sum(1 for r in out if not isinstance(r, BaseException))
        bad = [r for r in out if isinstance(r, BaseException)
               and not isinstance(r, FileNotFoundError)]
        if bad:
            violations.append(f"{n}: a racing unlink raised {bad[0]!r}, not ENOENT")
        elif ok != 1:
            violations.append(f"{n}: {ok} of two racing unlinks succeeded")
    return verdict("unlink_race", violations, f"late unlink ENOENT ({env.rounds}); "
                    f"{races} races, one winner",
                    {"sequential": env.rounds, "races": races})

def space_reservation(env: Env) -> Result:
    n = env.name("reserve")
    size, at, data = 1 << 20, 64 << 10, env.rng("reserve").randbytes(4096)
    fd = env.a.fs.open(env.a.path(n), write=True, create=True)
    violations = []
    try:
        if not env.a.fs.reserve(fd, 0, size):
            return Result("space_reservation", PASS, "not supported (the store appends "
                          "instead: set reserve_bytes=0)", {"supported": False})
        got = env.a.fs.fstat(fd).size
        if got < size:
            violations.append(f"reserving {size} bytes left the file at {got} bytes")
        head = env.a.fs.read_to_end(fd, 0, size)
        if head.count(0) != len(head):
            violations.append("the reserved range does not read as zeros")
        env.a.fs.writev(fd, [data], at)
        env.a.fs.fdatasync(fd)
    finally:
        env.a.fs.close(fd)
    seen = read_file(env.b, n) or b""
    if len(seen) < size:
        violations.append(f"B reads {len(seen)} bytes of a file reserved to {size}")
    elif seen[at:at + len(data)] != data or seen[:at].count(0) != at:
        violations.append("B does not read the write inside the reserved range back")
    keep = _reservation_keeping_size(env, size, at, data, violations)
    return verdict("space_reservation", violations, "1 MiB reserved: zeros, writable, "
                   "seen by B; " + ("keeping the size: writable, the size follows the writes"
                                    if keep else "keeping the size: not supported"),
                   {"supported": True, "keep_size": keep})


def _reservation_keeping_size(env: Env, size: int, at: int, data: bytes,
                              violations: list[str]) -> bool:
    """Packs reserve with ``keep_size``: the file's size must stay what was written (a
    caller sizes a pool by its packs), and a write into the reservation must read back."""
    n = env.name("reserve-keep")
    fd = env.a.fs.open(env.a.path(n), write=True, create=True)
    try:
        if not env.a.fs.reserve(fd, 0, size, keep_size=True):
            return False  # the store's packs then append
        if (got := env.a.fs.fstat(fd).size) != 0:
            violations.append(f"reserving {size} bytes keeping the size made an empty file "
                              f"{got} bytes")
        env.a.fs.writev(fd, [data], at)
        env.a.fs.fdatasync(fd)
    finally:
        env.a.fs.close(fd)
    seen = read_file(env.b, n) or b""
    if len(seen) != at + len(data):
        violations.append(f"B reads {len(seen)} bytes of a file written to "
                          f"{at + len(data)} inside a reservation keeping its size")
    elif seen[at:] != data or seen[:at].count(0) != at:
        violations.append("B does not read back a write inside a reservation keeping the "
                          "size")
    return True


def large_offsets(env: Env) -> Result:
    n = env.name("large")
    blobs = {off: env.rng(f"large{off}").randbytes(4096) for off in env.large_offsets}
    violations = []
    fd = env.a.fs.open(env.a.path(n), write=True, create=True)
    try:
        for off, blob in blobs.items():
            env.a.fs.writev(fd, [blob], off)
        env.a.fs.fsync(fd)
    except OSError as e:
        violations.append(f"writing 4 KiB at offset {off} failed: {e}")
    finally:
        env.a.fs.close(fd)
    if not violations:
        fd = env.b.fs.open(env.b.path(n))
        try:
            for off, blob in blobs.items():
                buf = bytearray(len(blob))
                got = env.b.fs.readinto(fd, buf, off)
                if bytes(buf[:got]) != blob:
                    violations.append(f"B reads other bytes back at offset {off}")
        finally:
            env.b.fs.close(fd)
    remove(env.a, n)
    return verdict("large_offsets", violations, "read back at "
                    + ", ".join(_gib(o) for o in env.large_offsets),
                    {"offsets": list(env.large_offsets)})


def _gib(offset: int) -> str:
    whole = offset >> 30
    return f"{whole} GiB+{offset - (whole << 30)}"


def full_filesystem(env: Env) -> Result:
    c = env.full
    if c is None:
        return Result("full_filesystem", SKIP, "not checked: give --full-check DIR (a "
                      "small filesystem qualify may fill: a tmpfs, a JuiceFS quota)")
    n = env.name("full")
    chunk = 1 << 20  # each chunk is fdatasynced: it is acknowledged, or the error says not
    rng = env.rng("full")
    acked: list[bytes] = []
    failure: OSError | None = None
    fd = c.fs.open(c.path(n), write=True, create=True)
    try:
        while len(acked) * chunk < env.full_limit:
            blob = rng.randbytes(chunk)
            try:
                c.fs.writev(fd, [blob], len(acked) * chunk)
                c.fs.fdatasync(fd)
            except OSError as e:
                failure = e
                break
            acked.append(blob)
    finally:
        try:
            c.fs.close(fd)
        except OSError:
            pass  # close may report the same ENOSPC again
    violations = []
    figures: dict[str, Any] = {"acknowledged_bytes": len(acked) * chunk}
    if failure is None:
        violations.append(f"no error after writing {env.full_limit:,} bytes: --full-check "
                          "must name a small filesystem (or the error is swallowed)")
    else:
        figures["errno"] = errno.errorcode.get(failure.errno or 0, str(failure.errno))
        if failure.errno not in (errno.ENOSPC, errno.EDQUOT):
            violations.append(f"a full filesystem failed the write with {figures['errno']}, "
                              "not ENOSPC/EDQUOT")
    data = read_file(c, n) or b""
    lost = sum(1 for i, blob in enumerate(acked) if data[i * chunk:(i + 1) * chunk] != blob)
    if lost:
        violations.append(f"{lost} of {len(acked)} acknowledged 1 MiB chunks read back "
                          "wrong after the filesystem filled")
    remove(c, n)
    try:
        write_file(c, env.name("full-after"), b"x" * 4096)
    except OSError as e:
        violations.append(f"after unlinking the filler, a 4 KiB write still fails: {e}")
    return verdict("full_filesystem", violations, f"full after {len(acked) * chunk:,} "
                    f"bytes: {figures.get('errno')}, every acknowledged byte kept", figures)


def mount_options(env: Env) -> Result:
    figures: dict[str, Any] = {}
    unsafe: list[str] = []
    kinds = []
    clients = [("path", env.a)] + ([("peer", env.b)] if env.b is not env.a else [])
    for label, c in clients:
        try:
            m = mount_of(c.fs, c.dir)
        except DeploymentMismatch as e:
            return Result("mount_options", SKIP, f"mount table not readable: {e}")
        kinds.append(m.fstype)
        entry: dict[str, Any] = {"mount_point": m.point, "type": m.fstype,
                                 "options": m.options}
        if m.fstype == JUICEFS_FSTYPE:
            try:
                live = juicefs_settings(read_juicefs_config(c.fs, m.point))
            except DeploymentMismatch as e:
                unsafe.append(f"{label}: {e}")
                continue
            entry["juicefs"] = live
            if live.get("writeback") is not False:
                unsafe.append(f"{label} {m.point}: writeback={live.get('writeback')!r} "
                              "(an fsync returns before object storage has the data)")
            if live.get("open_cache") != 0:
                unsafe.append(f"{label} {m.point}: open cache {live.get('open_cache')!r} s "
                              "(no close-to-open visibility across clients)")
            if live.get("readdir_cache") is not False:
                unsafe.append(f"{label} {m.point}: readdir cache "
                              f"{live.get('readdir_cache')!r} (stale listings)")
        figures[label] = entry
    if unsafe:
        return Result("mount_options", FAIL, "unsafe JuiceFS client settings: "
                      + "; ".join(unsafe), figures)
    if JUICEFS_FSTYPE in kinds:
        return Result("mount_options", PASS, "JuiceFS: no writeback, open or readdir "
                      "cache", figures)
    return Result("mount_options", PASS, f"type {', '.join(sorted(set(kinds)))}: no client "
                  "settings to check (the clauses above measured its behaviour)", figures)

CLAUSES: dict[str, Callable[[Env], Result]] = {
    "mount_options": mount_options,
    "exclusive_create": exclusive_create,
    "lock_exclusion": lock_exclusion,
    "lock_release_on_death": lock_release_on_death,
    "close_to_open": close_to_open,
    "rename_atomic": rename_atomic,
    "unlink_race": unlink_race,
    "attribute_staleness": attribute_staleness,
    "entry_staleness": entry_staleness,
    "listing_staleness": listing_staleness,
    "space_reservation": space_reservation,
    "large_offsets": large_offsets,
    "full_filesystem": full_filesystem,
}

__all__ = ["CLAUSES", "FAIL", "PASS", "SKIP", "Client", "Env", "HolderFactory", "LockHolder",
           "Result"]
