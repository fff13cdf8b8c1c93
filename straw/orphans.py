"""Orphaned retention: owners that nothing names any more, found and freed by an operator.

An owner keeps its roots, and what they depend on, until it is released (D4).  Every owner
straw creates is *named* by something that says why the data is kept, and that something
is what releases it in the end::

    kind         owner name                            named by
    queue        queue:<ns>/<id>                       the queue's directory in the pool
    pin          publication:pin:<host>:<pid>:<uuid>   the reader process holding the pin
    hold         publication:hold:<writer>:<key>       its writer, while alive (pool.hold_owners)
    (layers)     checkpoint:..., archive:...           a file of the layer that made it
    application  any other name                        the application: never judged here

An owner whose namer is gone is an *orphan*: its data stays for ever, and no routine call
frees it.  ``survey`` classifies every owner of a pool as ``named``, ``orphan`` or
``unknown`` (nothing here can tell, e.g. a pin of another host's process) with the reason;
``release`` drops the owners an operator chose (``straw gc --release-orphans``).

Straw cleans by itself only what it can prove: a hold of a dead writer goes at the next
collection (``straw.pool.hold_owners``), and so does the hold under which a rollout archive's save
keeps its data until its index names its owner.  Everything else needs the operator's
word, because a namer may be out of sight (another host's process, an index copied
elsewhere): the survey only reports.

The layers above the core name owners of their own in files the core does not read
(a checkpoint's commit marker, an archive's index).  They judge those owners through
``namers``: a callable per owner-name prefix, given ``(run, name)``, returning
``(status, why)``.  The survey itself is read-only (no lock taken, nothing written).
"""

from __future__ import annotations

import errno
import json
import os
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from .fs import Filesystem, PosixFS
from .pool.arguments import PIN_OWNER_PREFIX
from .pool.catalog.catalog import Catalog
from .pool.catalog.read import read_state
from .pool.hold_owners import HOLD_PREFIX
from .pool_view import catalog_view, check_pool
from .queue.coordinator import queue_dir
from .queue.ids import check_queue_id

NAMED, ORPHAN, UNKNOWN = "named", "orphan", "unknown"
QUEUE_PREFIX = "queue:"
LEGACY_PIN_PREFIX = "pin:"  # pins of pools written before the reserved prefix

Namer = Callable[[str, str], tuple[str, str]]


@dataclass(frozen=True)
class OwnerStatus:
    """One owner of the pool: its ``run`` and ``name``, ``kind`` (module docstring),
    ``bytes`` it keeps (its packs', shared ones counted for each owner), ``status``
    (named / orphan / unknown) and ``why`` (what names it, or why nothing does)."""

    run: str
    name: str
    kind: str
    bytes: int
    status: str
    why: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def process_alive(host: str, pid: int) -> bool | None:
    """Whether process ``pid`` of ``host`` is alive: None for another host's (nothing
    here can tell).  A reused pid reads as alive: the answer errs towards keeping data."""
    if host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, owned by someone else
    return True


def _pin(name: str) -> tuple[str, str]:
    rest = name[len(PIN_OWNER_PREFIX):] if name.startswith(PIN_OWNER_PREFIX) \
        else name[len(LEGACY_PIN_PREFIX):]
    host, _, tail = rest.partition(":")
    pid, _, _ = tail.partition(":")
    if not host or not pid.isdigit():
        return UNKNOWN, "a named pin: its reader releases it (release it once that reader stopped)"
    alive = process_alive(host, int(pid))
    if alive is None:
        return UNKNOWN, f"pinned by pid {pid} of host {host}, not this host"
    if alive:
        return NAMED, f"pinned by live process {pid}"
    return ORPHAN, f"its reader, process {pid} of this host, is dead"


def _queue(fs: Filesystem, root: str, run: str, name: str) -> tuple[str, str]:
    ns, sep, queue_id = name[len(QUEUE_PREFIX):].partition("/")
    try:
        if not sep or not ns:
            raise ValueError(name)
        check_queue_id(queue_id)
        where = queue_dir(root, run, ns, queue_id)
    except (TypeError, ValueError):
        return UNKNOWN, "not a queue name straw writes"
    legacy = os.path.join(root, "queues", ns, queue_id)
    for path in (where, legacy):
        try:
            if fs.stat(os.path.join(path, "journal")).is_dir:
                return NAMED, f"queue {os.path.relpath(path, root)}"
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as e:
            if e.errno not in (errno.ENAMETOOLONG,):
                return UNKNOWN, f"cannot look at its queue {path}: {e}"
    return ORPHAN, f"its queue {os.path.relpath(where, root)} is gone"


def classify(fs: Filesystem, root: str, run: str, name: str,
             namers: Mapping[str, Namer]) -> tuple[str, str, str]:
    """``(kind, status, why)`` of one owner (module docstring)."""
    if name.startswith(QUEUE_PREFIX):
        return ("queue", *_queue(fs, root, run, name))
    if name.startswith(HOLD_PREFIX):
        return "hold", NAMED, "its writer's; dropped with it (a collection drops a dead one's)"
    if name.startswith((PIN_OWNER_PREFIX, LEGACY_PIN_PREFIX)):
        return ("pin", *_pin(name))
    for prefix, namer in namers.items():
        if name.startswith(prefix):
            return (prefix.rstrip(":"), *namer(run, name))
    return "application", UNKNOWN, "the application's own owner"


def survey(root: str | os.PathLike[str], *, namers: Mapping[str, Namer] | None = None,
           fs: Filesystem | None = None) -> list[OwnerStatus]:
    """Every owner of the pool at ``root``, classified (read-only; module docstring)."""
    fs = fs or PosixFS()
    root = os.path.abspath(root)
    check_pool(fs, root)
    st = read_state(fs, root)
    sizes = catalog_view(fs, root, st)["owners"]
    out = []
    for run, name in sorted(st.owners):
        kind, status, why = classify(fs, root, run, name, namers or {})
        size = sizes.get(f"{run or '(legacy)'}/{name}", {}).get("bytes", 0)
        out.append(OwnerStatus(run, name, kind, size, status, why))
    return out


def release(root: str | os.PathLike[str], owners: Iterable[tuple[str, str]], *,
            fs: Filesystem | None = None) -> list[tuple[str, str]]:
    """Release the owners ``(run, name)`` an operator chose; returns those released (an
    owner gone meanwhile is skipped).  Queue owners and holds are refused (``ValueError``):
    a queue's coordinator and a hold's writer manage them (``straw.pool.hold_owners``)."""
    fs = fs or PosixFS()
    root = os.path.abspath(root)
    check_pool(fs, root)
    chosen = sorted(set(owners))
    for run, name in chosen:
        if name.startswith((QUEUE_PREFIX, HOLD_PREFIX)):
            raise ValueError(f"owner {name!r} of run {run!r} is managed by straw itself "
                             "(a queue's coordinator, a writer's hold): it is not released "
                             "here; recover the queue or let a collection drop the hold")
    done = []
    by_run: dict[str, list[str]] = {}
    for run, name in chosen:
        by_run.setdefault(run, []).append(name)
    for run, names in sorted(by_run.items()):
        catalog = Catalog(fs, root, run)
        try:
            done += [(run, n) for n in names if catalog.release(n)]
        finally:
            catalog.close()
    return done


def read_json(fs: Filesystem, path: str, limit: int) -> Any:
    """A small JSON file's value, or None if it is missing, larger than ``limit`` bytes,
    not a regular file or not JSON (a survey skips what it cannot read)."""
    try:
        fd = fs.open(path)
    except OSError:
        return None
    try:
        data = fs.read_to_end(fd, 0, limit + 1)
        return None if len(data) > limit else json.loads(data)
    except (OSError, ValueError):
        return None
    finally:
        fs.close(fd)


__all__ = ["NAMED", "ORPHAN", "UNKNOWN", "Namer", "OwnerStatus", "classify", "process_alive",
           "read_json", "release", "survey"]
