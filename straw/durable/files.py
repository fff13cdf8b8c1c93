"""Whole files written atomically and durably: the snapshots of both logs (the journal's
``s-*.snap``, the catalog's ``CATALOG.snap-*`` and ``CATALOG.head``).

A new file is written under a temporary name, fsynced, renamed to its final name and its
directory fsynced (D1), so that a name, once it exists, always holds the complete,
durable content: a crash leaves at most a temporary file, which its user deletes later.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..fs import Buffer, Filesystem


def write_new_file(fs: Filesystem, directory: str, path: str, tmp: str,
                   buffers: Sequence[Buffer], *, exclusive: bool = False) -> None:
    """Write ``buffers`` to ``tmp`` (created; ``exclusive``: it must not exist), fsync,
    rename it to ``path`` in ``directory``, fsync ``directory``.  On an OSError the
    temporary file is removed (best effort) and the error raised: nothing changed."""
    try:
        fd = fs.open(tmp, write=True, create=True, exclusive=exclusive)
        try:
            fs.writev(fd, buffers, 0)
            fs.fsync(fd)
        finally:
            fs.close(fd)
        fs.rename(tmp, path)
        fs.fsync_dir(directory)
    except OSError:
        unlink_quietly(fs, tmp)
        raise


def unlink_quietly(fs: Filesystem, path: str) -> None:
    """Remove ``path`` if possible (cleanup: a failure leaves a file that is ignored)."""
    try:
        fs.unlink(path)
    except OSError:
        pass
