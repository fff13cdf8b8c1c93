"""Confirm frames: how a log tells damage to an acknowledged write from a torn tail (D6).

Both logs of straw use this protocol: the pool's catalog (``straw.pool.catalog.log``) and
the queue journal (``straw.durable.journal``).  ``framing.scan_frames`` judges a bad
position by write groups: a damaged frame followed by a valid frame of a *later* group is
``CorruptData``; otherwise it is a torn tail, which its owner may cut.  A writer therefore
starts a new write group only after the previous group's sync returned, and after that
sync returned (the journal: and its fence), before anyone is told, it appends a *confirm*:
a frame that carries nothing, NOT synced, whose group start is its own offset.  The next
write group continues it (its frames carry the confirm's offset as group start), so the
confirm and the next group are one write group, covered by the next sync:

* a flipped byte in the last acknowledged group is followed by its valid confirm, a
  frame of a later group: ``CorruptData``, never cut;
* a power loss that tears the unsynced (confirm + next group) is a torn tail: everything
  in it is one group, and nothing in it was acknowledged;
* a process killed after the sync but before the confirm left the group intact and
  unacknowledged (process death does not damage written bytes).

Blind spot: the confirm is not synced by itself, so damage to the last group *and* a
power loss that also lost its confirm look like a torn tail (a double fault).

What a confirm holds is the user's: the catalog's is a catalog frame without operations
(with a nonce, so no two confirms have the same bytes), the journal's a one-byte record.
How a failed confirm is handled is the user's too: the catalog's is best effort (its
transaction is durable; the next client that replays it confirms it), the journal's makes
the journal unusable (its waiters were not told yet).
"""

from __future__ import annotations

from ..fs import Filesystem
from . import framing


def write_confirm(fs: Filesystem, fd: int, at: int, kind: int, body: bytes) -> bytes:
    """Write the confirm frame of ``kind`` holding ``body`` at offset ``at``, right after
    a durable write group; it begins the next write group (its group start is ``at``) and
    is not synced.  Returns the frame.  Raises OSError."""
    frame = framing.encode_frame(kind, body, group_start=at)
    fs.writev(fd, [frame], at)
    return frame
