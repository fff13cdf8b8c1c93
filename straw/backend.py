"""Storage profiles and the deployment declaration, checked against the live mount.

``FilesystemBackend(root, profile=..., declaration=..., fault=...)`` says what kind of
storage a pool lives on; ``SharedFilesystemStore(..., backend=backend)`` verifies it when
it starts, before it writes anything (names, attributes and errors as in straw-queue
0.1.6, so its callers port unchanged; the live check is ours).

Profiles:

* ``local`` -- a local disk (one machine).  Takes no declaration; nothing to check.
* ``juicefs`` -- a JuiceFS mount shared by several clients.  Needs a declaration with
  these fields (a missing or a wrong one is a ``ValueError`` naming it; other fields are
  kept, reported as unchecked in ``diagnostics()``)::

      direct_mount            bool   the client mounted with mount(2) (FuseOpts.DirectMount)
      writeback               bool   must be False: with --writeback an fsync returns before
                                     the data reached object storage (D1 would rest on one
                                     machine's cache disk)
      open_cache              number must be 0 (seconds): a cached open serves another
                                     client's file without asking the metadata engine, so
                                     close-to-open visibility is lost (D6's bounded retries
                                     would no longer be bounded)
      readdir_cache           bool   must be False: stale listings hide new journal
                                     segments and packs longer than the entry caches
      client_version          str    the JuiceFS client version, e.g. "1.4.2"
      durability_description  str    how the metadata engine and the object storage are
                                     made durable (replication, backups): an operator's
                                     statement, recorded in diagnostics, not checkable

  The live check (``verify``): the pool's mount in ``/proc/self/mountinfo`` must have type
  ``fuse.juicefs``, and the client's virtual ``.config`` file at the mount root must agree
  with every checkable field (``Meta.OpenCache`` in ns, ``Chunk.Writeback``,
  ``ReaddirCache``, ``FuseOpts.DirectMount``, ``Version``).  A contradiction raises
  ``DeploymentMismatch`` naming the declared and the live value.  straw-queue only records
  the declaration (its diagnostics say ``mount_options_automatically_verified: False``).

``fault`` (straw-queue's test hook) is called with the phase ``"before_file_sync"`` or
``"before_directory_sync"`` before every sync the store (and its coordinators) issue;
raising ``OSError`` there fails that sync as the storage would (the engine answers with
``StorageUnavailable`` and publishes nothing).  ``metrics["syncs"]`` counts the syncs.
Both work through ``filesystem(fs)``, the ``Filesystem`` the store uses.

All reads go through ``straw.fs.Filesystem``; this module writes nothing.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import DeploymentMismatch, InvalidReference
from .fs import Filesystem, PosixFS
from .fs_delegating import DelegatingFilesystem

PROFILES = ("local", "juicefs")
JUICEFS_FSTYPE = "fuse.juicefs"
MOUNTINFO = "/proc/self/mountinfo"
CONFIG_NAME = ".config"  # JuiceFS's virtual file at the mount root
FILE_SYNC = "before_file_sync"
DIRECTORY_SYNC = "before_directory_sync"

# field -> (kind, required value or None): the declaration's schema
_FIELDS: dict[str, tuple[str, Any]] = {
    "direct_mount": ("bool", None),
    "writeback": ("bool", False),
    "open_cache": ("seconds", 0),
    "readdir_cache": ("bool", False),
    "client_version": ("str", None),
    "durability_description": ("str", None),
}
_WHY = {
    "writeback": "with writeback an fsync returns before the data reached object storage",
    "open_cache": "a cached open skips the metadata engine, so another client's writes may "
                  "stay invisible (no close-to-open visibility)",
    "readdir_cache": "cached listings hide new journal segments and packs",
}


@dataclass(frozen=True)
class Mount:
    """One entry of the mount table: where, what type, from what source."""

    point: str
    fstype: str
    source: str
    options: str = ""  # the superblock options (NFS: actimeo, lookupcache, ...)


def validate_declaration(profile: str, declaration: object) -> dict[str, Any]:
    """The declaration, checked strictly for ``profile`` (see the module docstring).
    Every problem of a field is a ``ValueError`` naming it, as in straw-queue."""
    if profile == "local":
        if declaration not in (None, {}):
            raise ValueError("profile 'local' takes no declaration (a declaration describes "
                             "a shared mount); use profile='juicefs' or drop it")
        return {}
    if declaration is None:
        raise ValueError("profile 'juicefs' needs a declaration with the fields "
                         f"{', '.join(_FIELDS)}")
    if not isinstance(declaration, Mapping):
        raise TypeError(f"declaration must be a mapping of field -> value, got "
                        f"{type(declaration).__name__}")
    out: dict[str, Any] = {str(k): v for k, v in declaration.items() if k not in _FIELDS}
    for name, (kind, required) in _FIELDS.items():
        if name not in declaration:
            raise ValueError(f"declaration field {name!r} is missing (profile 'juicefs' "
                             "needs every field)")
        value = declaration[name]
        if kind == "bool" and not isinstance(value, bool):
            raise ValueError(f"declaration field {name!r} must be a bool (true/false), got "
                             f"{value!r}")
        if kind == "seconds" and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or value < 0):
            raise ValueError(f"declaration field {name!r} must be a number of seconds >= 0, "
                             f"got {value!r}")
        if kind == "str" and (not isinstance(value, str) or not value.strip()):
            raise ValueError(f"declaration field {name!r} must be a non-empty str, got "
                             f"{value!r}")
        if required is not None and value != required:
            raise ValueError(f"declaration field {name!r} is {value!r}; straw needs "
                             f"{required!r} on JuiceFS ({_WHY[name]}). Remount without it")
        out[name] = value
    return out


def _no_fault(phase: str) -> None:
    return None


class FilesystemBackend:
    """The storage a pool lives on: ``profile`` (``local`` or ``juicefs``) and, for
    ``juicefs``, the operator's ``declaration`` of the mount (validated at once;
    checked against the live mount by ``verify``, which the store calls at start).

    ``root`` is the pool directory, resolved (a ``pathlib.Path``); ``path(rel)`` a file
    of the pool; ``fault`` the sync hook and ``metrics`` the sync count (module
    docstring)."""

    def __init__(self, root: str | os.PathLike[str], *, profile: str = "local",
                 declaration: Mapping[str, Any] | None = None,
                 fault: Callable[[str], Any] | None = None) -> None:
        if profile not in PROFILES:
            raise ValueError(f"storage profile {profile!r} is unknown; use one of "
                             f"{', '.join(PROFILES)}")
        if fault is not None and not callable(fault):
            raise TypeError(f"fault must be a callable taking the phase, got "
                            f"{type(fault).__name__}")
        self.root = Path(PosixFS().realpath(os.path.abspath(os.fspath(root))))
        self.profile = profile
        self.declaration = validate_declaration(profile, declaration)
        self.fault: Callable[[str], Any] = fault or _no_fault
        self.metrics: dict[str, int] = {"syncs": 0}
        self.live: dict[str, Any] | None = None  # what verify() read from the mount

    def serves(self, root: str | os.PathLike[str]) -> bool:
        """Is ``root`` this backend's pool directory (after resolving symlinks)?"""
        return PosixFS().realpath(os.path.abspath(os.fspath(root))) == str(self.root)

    def path(self, relative: str) -> Path:
        """The file ``relative`` (plain ``/``-separated names) of the pool.
        ``InvalidReference`` if it is not such a path or a symlink leads it outside the
        root."""
        if not isinstance(relative, str):
            raise InvalidReference(f"a pool path must be a relative POSIX path (str), got "
                                   f"{type(relative).__name__}")
        parts = relative.split("/")
        if relative.startswith("/") or any(p in ("", ".", "..") or "\0" in p for p in parts):
            raise InvalidReference(f"pool path {relative!r} leaves the pool {self.root} or is "
                                   "not plain: give names separated by '/', without '.', "
                                   "'..' or empty parts")
        full = self.root.joinpath(*parts)
        real = PosixFS().realpath(str(full))
        if real != str(self.root) and not real.startswith(str(self.root) + os.sep):
            raise InvalidReference(f"pool path {relative!r} leads through a symlink to "
                                   f"{real}, outside the pool {self.root}")
        return full

    def sync_directory(self, path: str | os.PathLike[str]) -> None:
        """fsync the directory ``path`` (through the sync hook and count); an error is
        raised, never ignored."""
        self.filesystem(PosixFS()).fsync_dir(os.fspath(path))

    def open_committed(self, relative: str) -> io.BytesIO:
        """The current content of the pool file ``relative`` (small control files), read
        with a fresh open (close-to-open visibility on a shared filesystem)."""
        return io.BytesIO(PosixFS().read_file(str(self.path(relative))))

    def filesystem(self, fs: Filesystem) -> Filesystem:
        """``fs`` with this backend's sync hook and sync count (what the store uses)."""
        return fs if isinstance(fs, _ObservedFS) and fs.backend is self else _ObservedFS(fs, self)

    def verify(self, fs: Filesystem | None = None) -> None:
        """Check the declaration against the live mount (``juicefs``); raises
        ``DeploymentMismatch`` naming both values.  Reads only."""
        if self.profile != "juicefs":
            return
        fs = fs or PosixFS()
        root = str(self.root)
        mount = mount_of(fs, root)
        if mount.fstype != JUICEFS_FSTYPE:
            raise DeploymentMismatch(
                f"pool {root} is declared on JuiceFS (profile 'juicefs') but its mount "
                f"{mount.point} has type {mount.fstype!r}, not {JUICEFS_FSTYPE!r}. Mount "
                "JuiceFS there, or use profile='local'")
        live = juicefs_settings(read_juicefs_config(fs, mount.point))
        self.live = live
        problems = compare(self.declaration, live)
        if problems:
            raise DeploymentMismatch(
                f"pool {root}: the JuiceFS mount {mount.point} contradicts the "
                f"declaration: {'; '.join(problems)}. Remount with the declared options or "
                "correct the declaration")

    def diagnostics(self) -> dict[str, Any]:
        """straw-queue's keys (``profile``, ``declaration``,
        ``mount_options_automatically_verified``, ``multi_machine_admission``,
        ``directory_sync``) and ours (``mount_verified``, ``live``,
        ``unchecked_fields``)."""
        verified = self.live is not None
        return {
            "profile": self.profile,
            "declaration": dict(self.declaration),
            "mount_options_automatically_verified": verified,
            # several clients' agreement is what `straw qualify --peer` measures
            "multi_machine_admission": "not_verified",
            "directory_sync": "required; errors are fatal",
            "mount_verified": verified,
            "live": dict(self.live) if verified and self.live is not None else None,
            "unchecked_fields": sorted(k for k in self.declaration if k not in _FIELDS),
        }

    def __repr__(self) -> str:
        return f"FilesystemBackend({str(self.root)!r}, profile={self.profile!r})"


class _ObservedFS(DelegatingFilesystem):
    """A ``Filesystem`` that calls its backend's ``fault`` hook before every sync and
    counts the syncs; every other primitive is the wrapped filesystem's own method, bound on
    the instance (no extra call on the data path; the inherited forwarding methods are the
    interface, shadowed by these attributes)."""

    _PRIMITIVES = ("open", "open_beneath", "close", "writev", "readinto", "truncate",
                   "fstat", "reserve", "lock", "unlock", "mkdir", "rename", "unlink",
                   "stat", "listdir", "realpath")

    def __init__(self, inner: Filesystem, backend: FilesystemBackend) -> None:
        super().__init__(inner)
        self.backend = backend
        for name in self._PRIMITIVES:
            self.__dict__[name] = getattr(inner, name)

    def __getattr__(self, name: str) -> Any:  # what the wrapped filesystem adds (SimFS)
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    def _sync(self, phase: str) -> None:
        self.backend.fault(phase)  # may raise OSError: the sync fails as the storage's would
        self.backend.metrics["syncs"] = self.backend.metrics.get("syncs", 0) + 1

    def fsync(self, fd: int) -> None:
        self._sync(FILE_SYNC)
        self.inner.fsync(fd)

    def fdatasync(self, fd: int) -> None:
        self._sync(FILE_SYNC)
        self.inner.fdatasync(fd)

    def fsync_dir(self, path: str) -> None:
        self._sync(DIRECTORY_SYNC)
        self.inner.fsync_dir(path)


# --- the live mount -----------------------------------------------------------------------
def unescape_mountinfo(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (``\\040``)."""
    out, i = [], 0
    while i < len(field):
        code = field[i + 1:i + 4]
        if field[i] == "\\" and len(code) == 3 and code.isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 2:
            continue
        mounts.append(Mount(unescape_mountinfo(fields[4]), tail[0], unescape_mountinfo(tail[1]),
                            tail[2] if len(tail) > 2 else ""))
    return mounts


def mount_of(fs: Filesystem, path: str, mountinfo: str = MOUNTINFO) -> Mount:
    """The mount holding ``path`` (which may not exist yet: its nearest existing parent
    decides): the longest mount point that contains it."""
    real = fs.realpath(path)
    try:
        fd = fs.open(mountinfo)
        try:
            text = fs.read_to_end(fd).decode(errors="replace")  # /proc sizes read as 0
        finally:
            fs.close(fd)
    except OSError as e:
        raise DeploymentMismatch(f"cannot read the mount table {mountinfo} to check the "
                                 f"mount of {path}: {e}") from e
    best: Mount | None = None
    for m in parse_mountinfo(text):
        inside = real == m.point or real.startswith(m.point.rstrip("/") + "/")
        if inside and (best is None or len(m.point) >= len(best.point)):
            best = m
    if best is None:
        raise DeploymentMismatch(f"no entry of {mountinfo} holds {real}")
    return best


def read_juicefs_config(fs: Filesystem, mount_point: str) -> dict[str, Any]:
    path = os.path.join(mount_point, CONFIG_NAME)
    try:
        fd = fs.open(path)
        try:
            data = fs.read_to_end(fd)
        finally:
            fs.close(fd)
        config = json.loads(data)
    except (OSError, ValueError) as e:
        raise DeploymentMismatch(
            f"cannot read the JuiceFS client settings {path} ({e}); straw checks the "
            "declaration against them. Mount without --hide-internal, or upgrade the client"
        ) from e
    if not isinstance(config, dict):
        raise DeploymentMismatch(f"{path} does not hold a JSON object")
    return config


def juicefs_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The checkable declaration fields, as the client reports them in ``.config``
    (``None`` where the client does not report one), plus its cache timeouts (seconds)."""
    def get(*keys: str) -> Any:
        cur: Any = config
        for k in keys:
            if not isinstance(cur, Mapping) or k not in cur:
                return None
            cur = cur[k]
        return cur

    def seconds(ns: Any) -> float | None:
        return ns / 1e9 if isinstance(ns, (int, float)) and not isinstance(ns, bool) else None

    return {
        "direct_mount": get("FuseOpts", "DirectMount"),
        "writeback": get("Chunk", "Writeback"),
        "open_cache": seconds(get("Meta", "OpenCache")),
        "readdir_cache": get("ReaddirCache"),
        "client_version": get("Version"),
        "attr_cache": seconds(get("AttrTimeout")),
        "entry_cache": seconds(get("EntryTimeout")),
        "dir_entry_cache": seconds(get("DirEntryTimeout")),
        "negative_entry_cache": seconds(get("NegEntryTimeout")),
    }


def version_matches(declared: str, live: str) -> bool:
    """``1.4.2`` matches a client reporting ``1.4.2+2026-10-26.pypi`` (build suffix) and
    ``1.4`` matches ``1.4.x``; ``1.4.2`` does not match ``1.4.20``."""
    base = live.split("+", 1)[0]
    return declared in (live, base) or base.startswith(declared + ".")


def compare(declared: Mapping[str, Any], live: Mapping[str, Any]) -> list[str]:
    """Every declared field the live settings contradict, as 'field: declared X, mount
    reports Y' (a field the client does not report is a contradiction too: unverifiable)."""
    problems = []
    for name in ("direct_mount", "writeback", "open_cache", "readdir_cache",
                 "client_version"):
        want, got = declared.get(name), live.get(name)
        if name == "client_version":
            ok = isinstance(got, str) and version_matches(str(want), got)
        elif name == "open_cache":
            ok = isinstance(got, float) and abs(got - float(want or 0)) < 1e-9
        else:
            ok = got is want
        if not ok:
            problems.append(f"{name}: declared {want!r}, mount reports {got!r}")
    return problems


def implied_declaration(live: Mapping[str, Any]) -> dict[str, Any]:
    """The declaration that describes this live mount (what ``straw qualify`` prints); the
    operator still writes ``durability_description``."""
    return {
        "direct_mount": live.get("direct_mount"),
        "writeback": live.get("writeback"),
        "open_cache": live.get("open_cache"),
        "readdir_cache": live.get("readdir_cache"),
        "client_version": str(live.get("client_version") or "").split("+", 1)[0],
        "durability_description": "<how the metadata engine and object storage are "
                                  "replicated/backed up>",
    }


__all__ = ["FilesystemBackend", "Mount", "PROFILES", "compare", "implied_declaration",
           "juicefs_settings", "mount_of", "parse_mountinfo", "read_juicefs_config",
           "validate_declaration"]
