"""Negative controls: deliberately broken variants of the store and of the framing layer,
made by monkeypatching ``straw`` for the duration of a ``with`` block (``straw/`` itself is
never changed).  Each crash or frame campaign must catch every control aimed at it; a
control that is not caught means the campaign has lost its power to find that bug.

Store controls (caught by the store crash campaign):

* ``reply-before-fsync`` -- ``PackWriter.append_group`` skips its ``fdatasync``: a
  reference is returned before its bytes are durable (breaks D1).
* ``no-dir-fsync-new-pack`` -- a new pack's name is never made durable by a directory
  fsync (breaks D1: a power loss can make the whole pack vanish).
* ``torn-tail-is-corruption`` -- the scanner reports an unsynced, torn final frame as
  ``CorruptData`` (breaks D6: recovery fails after an ordinary power loss).
* ``scanner-accepts-garbage`` -- the scanner accepts a frame without checking its body
  (breaks D6: a torn, never-acknowledged extent is indexed and returned by lookup).
* ``recovery-trusts-unsynced`` -- recovery indexes a killed predecessor's open pack
  without fsyncing it first (breaks D1 for references returned by lookup/retry).
* ``index-forgets-predecessors`` -- a new writer incarnation does not rebuild the
  idempotency index of the earlier ones (breaks D7).

Shared-root controls (caught by the shared-root fuzz scenario, ``fault_injection.runs_fuzz``):

* ``runs-share-owners`` -- the former behaviour: owner names are global to the root (an
  owner is keyed by its name alone) and a store's collection is pool-wide, so one run's
  retain replaces another run's roots of the same name and its collection reclaims them.

Frame controls (caught by the frame campaign):

* ``decode-skips-body-checksum`` -- ``decode_frame`` does not verify the body.
* ``short-frame-is-corrupt`` -- ``decode_frame`` reports an incomplete frame as corrupt.
* ``scan-never-corrupt`` -- ``scan_frames`` treats every damaged frame as a torn tail.
* ``torn-tail-is-corruption`` also breaks the frame campaign's file-level prefix check.
* ``journal-no-confirm`` -- the queue journal writes no confirm records: a
  flipped byte in its last, acknowledged transaction looks like a torn tail (D6).
  The journal and coordinator campaigns catch it too (their ``kill+damage`` modes), with
  the journal's other damaged-tail controls (``fault_injection.journal_campaign``).

Catalog controls (caught by the catalog campaign's damaged-tail check,
``fault_injection.catalog_campaign.check_damaged_tail``):

* ``catalog-without-confirm`` -- the catalog writes no confirm frame after a transaction
  (breaks D6: one flipped byte in the last acknowledged transaction is cut off as a torn
  tail, silently losing, say, a retain).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

from fault_injection.journal_campaign import JOURNAL_CONTROLS
from straw import catalog, framing
from straw.catalog import Catalog
from straw.catalog_read import decode_ops
from straw.catalog_state import LEGACY_RUN, CatalogState
from straw.errors import CorruptData
from straw.pool import pack, recovery, writer

NO_SYNC = frozenset({"fsync", "fsync_dir"})
"""What ``SkipOps`` skips for a filesystem whose fsyncs do nothing."""


class SkipOps:
    """A ``Filesystem`` stand-in that silently skips some operations (``fsync_dir`` ...)."""

    def __init__(self, fs: Any, skip: frozenset[str]) -> None:
        self._fs = fs
        self._skip = skip

    def __getattr__(self, name: str) -> Any:
        if name in self._skip:
            return lambda *args, **kwargs: None
        return getattr(self._fs, name)


@contextlib.contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


def _reply_before_fsync() -> contextlib.AbstractContextManager[None]:
    orig = pack.PackWriter.append_group

    def append_group(self: pack.PackWriter, extents: Any) -> None:
        real = self.fs
        self.fs = SkipOps(real, frozenset({"fdatasync"}))  # type: ignore[assignment]
        try:
            orig(self, extents)
        finally:
            self.fs = real

    return _patched(pack.PackWriter, "append_group", append_group)


def _no_dir_fsync_new_pack() -> contextlib.AbstractContextManager[None]:
    orig = pack.PackWriter.__init__

    def init(self: pack.PackWriter, fs: Any, *args: Any, **kwargs: Any) -> None:
        orig(self, SkipOps(fs, frozenset({"fsync_dir"})), *args, **kwargs)  # type: ignore[arg-type]
        self.fs = fs

    return _patched(pack.PackWriter, "__init__", init)


def _torn_tail_is_corruption() -> contextlib.AbstractContextManager[None]:
    orig = framing.scan_frames

    def scan_frames(read_at: Any, size: int, *, start: int = 0) -> framing.ScanResult:
        result = orig(read_at, size, start=start)
        if result.torn:
            raise CorruptData(f"damaged final frame at offset {result.end} (control)")
        return result

    return _patched(framing, "scan_frames", scan_frames)


def _scanner_accepts_garbage() -> contextlib.AbstractContextManager[None]:
    def try_frame(read_at: Any, pos: int) -> framing.ScannedFrame | None:
        try:
            header = framing.decode_header(read_at(pos, framing.HEADER_SIZE))
        except (framing.TornFrame, CorruptData):
            return None
        if header.group_start > pos:
            return None
        body = read_at(pos + framing.HEADER_SIZE, header.body_length)
        if len(body) < header.body_length:
            return None
        return framing.ScannedFrame(pos, header, body)  # body checksum not verified

    return _patched(framing, "_try_frame", try_frame)


def _recovery_trusts_unsynced() -> contextlib.AbstractContextManager[None]:
    orig = recovery._pack_entries

    def pack_entries(fs: Any, root: str, rel: str) -> Any:
        return orig(SkipOps(fs, frozenset({"fsync"})), root, rel)

    return _patched(recovery, "_pack_entries", pack_entries)


def _index_forgets_predecessors() -> contextlib.AbstractContextManager[None]:
    orig = writer.WriterIncarnation._load_index

    def load_index(self: writer.WriterIncarnation, *args: Any, **kwargs: Any) -> Any:
        result = orig(self, *args, **kwargs)
        self.index.clear()
        return result

    return _patched(writer.WriterIncarnation, "_load_index", load_index)


def _decode_skips_body_checksum() -> contextlib.AbstractContextManager[None]:
    def decode_frame(buf: Any) -> tuple[framing.FrameHeader, memoryview]:
        mv = memoryview(buf).cast("B")
        header = framing.decode_header(mv)
        if mv.nbytes < header.frame_length:
            raise framing.TornFrame("short")
        return header, mv[framing.HEADER_SIZE:header.frame_length]

    return _patched(framing, "decode_frame", decode_frame)


def _short_frame_is_corrupt() -> contextlib.AbstractContextManager[None]:
    orig = framing.decode_frame

    def decode_frame(buf: Any) -> tuple[framing.FrameHeader, memoryview]:
        try:
            return orig(buf)
        except framing.TornFrame as e:
            raise CorruptData(f"short frame: {e} (control)") from None

    return _patched(framing, "decode_frame", decode_frame)


def _scan_never_corrupt() -> contextlib.AbstractContextManager[None]:
    orig = framing.scan_frames

    def scan_frames(read_at: Any, size: int, *, start: int = 0) -> framing.ScanResult:
        try:
            return orig(read_at, size, start=start)
        except CorruptData:
            # fall back to "everything from the first bad frame is a torn tail"
            frames: list[framing.ScannedFrame] = []
            pos = start
            while pos < size:
                f = framing._try_frame(read_at, pos)
                if f is None:
                    break
                frames.append(f)
                pos += f.header.frame_length
            return framing.ScanResult(frames, pos, torn=True, sealed=False)

    return _patched(framing, "scan_frames", scan_frames)


def _catalog_without_confirm() -> contextlib.AbstractContextManager[None]:
    def confirm(self: catalog.Catalog, fd: int) -> None:
        return None  # no confirm frame: the last transaction ends the catalog

    return _patched(catalog.Catalog, "_confirm", confirm)


def _compaction_snapshot_not_durable() -> contextlib.AbstractContextManager[None]:
    """The catalog is truncated while the snapshot (and head copy) may still be only in
    the page cache: written and renamed, never fsynced (CS1's order broken)."""
    def write_durable(self: catalog.Catalog, path: str, data: bytes, what: str) -> None:
        tmp = f"{path}.tmp.nosync"
        fd = self.fs.open(tmp, write=True, create=True)
        try:
            self.fs.writev(fd, [data], 0)
        finally:
            self.fs.close(fd)
        self.fs.rename(tmp, path)

    return _patched(catalog.Catalog, "_write_durable", write_durable)


def _compaction_without_suffix() -> contextlib.AbstractContextManager[None]:
    """The base frame carries no suffix: what other clients appended while the snapshot
    was being written is lost when the catalog is truncated (CS1)."""
    install = catalog.Catalog._install

    def without_suffix(self: catalog.Catalog, job: Any) -> dict[str, Any]:
        return install(self, dataclasses.replace(job, x=self._offset))

    return _patched(catalog.Catalog, "_install", without_suffix)


def _follow_unlisted_view() -> contextlib.AbstractContextManager[None]:
    """A client follows another's compaction from a view the base frame does not list,
    applying the whole suffix (CS2's check skipped): a client whose view ended before the
    snapshot point misses what was appended between its view and that point."""
    def follow(self: catalog.Catalog, fd: int) -> bool:
        data = self._read_from(fd, 0)
        scan = framing.scan_frames(lambda o, n: data[o:o + n], len(data))
        first = scan.frames[0]
        frame = data[:first.header.frame_length]
        ops = decode_ops(first.body, "catalog")
        if len(scan.frames) < 2 or ops[0].get("op") != "base":
            return False
        for op in ops[1:]:
            self.state.apply(op)
        self._head, self._base_end = frame, len(frame)
        self._gen, self._snap_bytes = ops[0]["gen"], ops[0].get("bytes", 0)
        self._tail_start, self._tail = 0, frame
        self._offset = self._group_start = len(frame)
        return True

    return _patched(catalog.Catalog, "_follow", follow)


COMPACTION_CONTROLS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "snapshot-not-durable": _compaction_snapshot_not_durable,
    "compaction-without-suffix": _compaction_without_suffix,
}


# CS2 (a live client's view, not a crash state): caught by tests/test_catalog_follow.py
FOLLOW_CONTROLS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "follow-unlisted-view": _follow_unlisted_view,
}


STORE_CONTROLS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "reply-before-fsync": _reply_before_fsync,
    "no-dir-fsync-new-pack": _no_dir_fsync_new_pack,
    "torn-tail-is-corruption": _torn_tail_is_corruption,
    "scanner-accepts-garbage": _scanner_accepts_garbage,
    "recovery-trusts-unsynced": _recovery_trusts_unsynced,
    "index-forgets-predecessors": _index_forgets_predecessors,
}

@contextlib.contextmanager
def _runs_share_owners() -> Iterator[None]:
    def by_name(_self: CatalogState, op: dict[str, Any], *_roots: Any) -> tuple[str, str]:
        return (LEGACY_RUN, op["owner"])

    with _patched(CatalogState, "_owner_key", by_name), \
            _patched(CatalogState, "_current_key", by_name), \
            _patched(Catalog, "collect", Catalog.collect_pool):
        yield


RUNS_CONTROLS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "runs-share-owners": _runs_share_owners,
}

FRAME_CONTROLS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "decode-skips-body-checksum": _decode_skips_body_checksum,
    "short-frame-is-corrupt": _short_frame_is_corrupt,
    "scan-never-corrupt": _scan_never_corrupt,
    "torn-tail-is-corruption": _torn_tail_is_corruption,
    "journal-no-confirm": JOURNAL_CONTROLS["journal-no-confirm"],
}

CATALOG_CONTROLS: dict[str, Callable[[], contextlib.AbstractContextManager[None]]] = {
    "catalog-without-confirm": _catalog_without_confirm,
}
