"""straw-queue's queue marker, ``<pool root>/queues/<digest(queue_id)>/run.json``.

straw-queue 0.1.6 creates that file when it creates a namespaced queue, and its callers
read its existence as "this queue was created": vime passes ``recover=True`` exactly when
it is there (a restarted job opens its queue by recovery, a new branch starts empty).
straw's queues live elsewhere (``runs/<run>/queues/<ns>/<dir>``, ``straw.coordinator``),
so it writes and honours the marker as part of the compatibility surface, with the same
meaning:

* **Written before the queue exists.**  A new namespaced queue's marker is durable (file
  and directory fsync) before its first epoch file is created, so a crash in between
  leaves a marker and no queue, never a queue and no marker.  A caller that recovers
  because the marker is there finds either the queue or nothing (``recover=True`` of a
  queue that does not exist yet starts it empty), never a queue it would open afresh.
  A namespaced queue created before straw wrote markers gets its marker when it is
  recovered.
* **Honoured.**  A marker present while the queue has no epoch means the queue was
  created: opening it without ``recover=True`` is ``UnsafeRecovery``, as the queue's own
  epochs would make it.
* **Checked.**  The marker names its queue and run.  One that is not this format
  (damaged, truncated, not JSON, another version) is ``CorruptData``; one naming another
  queue id (a digest collision or an edited file) or another run of the pool (straw-queue
  keeps one run's queue per id and root) is ``UnsafeRecovery``; never a fresh queue.

Format (canonical JSON, as ``straw.reporting.canonical_json`` writes it)::

    {"format": "straw.queue-marker", "version": 1, "run_id": ..., "queue_id": ...,
     "namespace": ..., "lease_seconds": ...}

``version``, ``run_id``, ``queue_id`` and ``lease_seconds`` are straw-queue's fields of the
same names; ``format`` and ``namespace`` are ours.  The file is opened beneath the pool
root, following no symbolic link, and read to at most ``_MAX_BYTES``.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ..errors import CorruptData, UnsafeRecovery, storage_error
from ..fs import Filesystem, NotBeneath
from ..protocol import digest
from ..reporting import canonical_json

FORMAT = "straw.queue-marker"
VERSION = 1
_MAX_BYTES = 64 << 10  # a marker is ~200 bytes; never read an arbitrary file whole


def marker_rel(queue_id: str) -> str:
    """The marker's path relative to the pool root (straw-queue's)."""
    return f"queues/{digest(queue_id)}/run.json"


class QueueMarker:
    """The marker of one namespaced queue of one run of the pool at ``root``."""

    def __init__(self, fs: Filesystem, root: str, *, run_id: str, queue_id: str,
                 namespace: str) -> None:
        self.fs, self.root = fs, root
        self.run_id, self.queue_id, self.namespace = run_id, queue_id, namespace
        self.rel = marker_rel(queue_id)
        self.path = os.path.join(root, self.rel)

    def read(self) -> dict[str, Any] | None:
        """The marker's fields, None if there is none; ``CorruptData`` for a damaged one,
        ``UnsafeRecovery`` for one of another queue or run."""
        try:
            fd = self.fs.open_beneath(self.root, self.rel)
        except FileNotFoundError:
            return None
        except NotBeneath as e:
            raise UnsafeRecovery(f"queue marker {self.path} is not a regular file beneath "
                                 f"the pool root ({e}); remove what is there") from e
        except OSError as e:
            raise storage_error(e, f"cannot open queue marker {self.path}") from e
        try:
            data = self.fs.read_to_end(fd, 0, _MAX_BYTES + 1)
        except OSError as e:
            raise storage_error(e, f"cannot read queue marker {self.path}") from e
        finally:
            self.fs.close(fd)
        fields = self._parse(data)
        for key, mine in (("queue_id", self.queue_id), ("run_id", self.run_id)):
            if fields[key] != mine:
                raise UnsafeRecovery(
                    f"queue marker {self.path} names {key} {fields[key]!r}, not "
                    f"{mine!r}: that queue id is taken in this pool by another queue or run "
                    "(straw-queue's layout keeps one per id and pool root); choose another "
                    "queue_id, or open the pool as that run")
        return fields

    def _parse(self, data: bytes) -> dict[str, Any]:
        damaged = f"queue marker {self.path} is damaged"
        fix = ("; restore it from a backup, or remove it if queue "
               f"{self.namespace}/{self.queue_id} of run {self.run_id!r} never held work")
        if len(data) > _MAX_BYTES:
            raise CorruptData(f"{damaged}: longer than {_MAX_BYTES} bytes{fix}")
        try:
            fields = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise CorruptData(f"{damaged}: not JSON ({e}){fix}") from None
        if not isinstance(fields, dict) or fields.get("format") != FORMAT:
            raise CorruptData(f"{damaged}: not a {FORMAT} record{fix}")
        if fields.get("version") != VERSION:
            raise CorruptData(f"{damaged}: version {fields.get('version')!r}, this straw "
                              f"reads version {VERSION}{fix}")
        if not all(isinstance(fields.get(k), str) for k in ("run_id", "queue_id")):
            raise CorruptData(f"{damaged}: run_id and queue_id must be strings{fix}")
        return fields

    def open(self, *, recover: bool, queue_exists: bool, lease_seconds: float) -> None:
        """Before the queue's next epoch: check the marker (refusing to open afresh a
        queue whose marker says it was created), and make it durable if it is not there
        (a new queue, or one created before markers)."""
        if self.read() is None:
            self._write(lease_seconds)
        elif not recover and not queue_exists:
            raise UnsafeRecovery(
                f"queue {self.namespace}/{self.queue_id} was created (its marker "
                f"{self.path} exists) but holds no epoch yet: a coordinator stopped while "
                "creating it. Open it with recover=True")

    def _write(self, lease_seconds: float) -> None:
        directory = os.path.dirname(self.path)
        try:
            self.fs.makedirs_durable(directory)
            expected = os.path.join(self.fs.realpath(self.root), os.path.dirname(self.rel))
            if self.fs.realpath(directory) != expected:
                raise UnsafeRecovery(f"queue marker directory {directory} leads outside "
                                     "the pool root (a symbolic link); remove it")
            self.fs.write_file_durable(self.path, canonical_json({
                "format": FORMAT, "version": VERSION, "run_id": self.run_id,
                "queue_id": self.queue_id, "namespace": self.namespace,
                "lease_seconds": lease_seconds,
            }))
        except OSError as e:
            raise storage_error(e, f"cannot write queue marker {self.path}") from e


__all__ = ["FORMAT", "VERSION", "QueueMarker", "marker_rel"]
