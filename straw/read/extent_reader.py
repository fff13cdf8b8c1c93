"""Reads of extents that check what they return: a manifest alone (``extent``), a
whole extent hashed against its frame header (``read_extent``), or many extents' frame
headers in bulk (``confirm_published``).

No buffer larger than one read chunk is allocated for a reference before an
authenticated frame header at its offset said that the extent has exactly its size and
the file was seen to hold all of it.  A whole extent is read in one pass over memory:
each payload straight into its own ``bytes`` object, chunk by chunk, each chunk hashed
while it is still in the CPU cache.  A mismatch whose bytes end in zero pages may be
another client's partial view of fresh data (``visibility``): reread a bounded number of
times; if it persists it is corruption.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import xxhash

from ..durable import framing
from ..errors import CorruptData, InvalidReference, StrawError
from ..pool.pack import EXTENT_PREFIX, decode_manifest, manifest_size
from ..pool.records import Record
from ..pool.refs import SegmentRef, check_pack_path
from . import buffers
from .buffers import fresh_bytes
from .cache import PackCache
from .extents import ExtentInfo, check_extent_size, extent_info
from .visibility import Attempts, Visibility, zero_tail

FIRST_READ = 64 * 1024  # the first read of an extent: header and manifest, as a rule
CHUNK = 1 << 19  # read-and-hash granularity of whole-extent reads
# confirm_published: one read covers headers at most this far apart, and this long in all
# (the bytes between them are read too: bounded, and cheaper than a read per header)
BULK_GAP = 64 * 1024
BULK_SPAN = 4 * 1024 * 1024

# one pass over an extent: (body checksum matched, its manifest, the payloads, the (file
# offset, bytes) parts read, for the zero-tail rule, which may view the payloads)
Pass = tuple[bool, "ExtentInfo | None", list[bytes], list[tuple[int, memoryview]]]


class ExtentReader:
    """Checked reads of extents through a session's cache and visibility rules (the
    references are checked by the caller)."""

    def __init__(self, cache: PackCache, visibility: Visibility) -> None:
        self.cache = cache
        self.visibility = visibility

    def remember(self, seg: SegmentRef, raw: dict[str, Any], payload_start: int,
                 body_length: int) -> ExtentInfo:
        """The ``ExtentInfo`` of an authenticated manifest, cached."""
        ext = extent_info(seg, raw, payload_start, body_length)
        self.cache.remember(seg, ext)
        return ext

    def extent(self, seg: SegmentRef) -> ExtentInfo:
        """The checked manifest of the extent ``seg`` names (cached): its frame header
        matches the reference (size, checksum) and the manifest its own checksum."""
        cached = self.cache.extents.get(seg)
        if cached is not None:
            return cached
        check_extent_size(seg)
        read_exact = self.visibility.read_exact
        head = read_exact(seg.path, seg.offset, min(seg.size, FIRST_READ), frame=True,
                          frame_size=seg.size)
        header = self.visibility.check_header(seg, head)
        body_head = memoryview(head)[framing.HEADER_SIZE:]
        if body_head.nbytes < EXTENT_PREFIX.size:
            raise InvalidReference(f"{seg!r}: too small to be an extent")
        need = manifest_size(body_head)
        if need > header.body_length:
            raise CorruptData(f"{seg.path} offset {seg.offset}: manifest longer than extent")
        if need > body_head.nbytes:
            body_head = memoryview(read_exact(seg.path, seg.offset + framing.HEADER_SIZE,
                                              need))
        raw, payload_start = decode_manifest(body_head, f"{seg.path} offset {seg.offset}")
        return self.remember(seg, raw, payload_start, header.body_length)

    def read_extent(self, seg: SegmentRef, *, keep: bool = True
                    ) -> tuple[ExtentInfo, list[Record]]:
        """Read and check a whole extent; its records with ``bytes`` payloads (none with
        ``keep=False``: every byte is checked, none kept, through a bounded scratch
        buffer).  ``seg`` is checked by the caller."""
        check_extent_size(seg)
        if seg.size > CHUNK:
            # Nothing large is allocated for a reference before its size is known right:
            # the authenticated header at its offset names exactly this size, and the file
            # holds its last byte (or the lag/final rules decided, without allocating).
            head = self.visibility.read_exact(seg.path, seg.offset, framing.HEADER_SIZE,
                                              frame=True)
            self.visibility.check_header(seg, head)
            self.visibility.read_exact(seg.path, seg.offset + seg.size - 1, 1)
        ok, ext, payloads, parts = self._read_and_hash(seg, keep=keep)
        tries: Attempts | None = None
        while not ok:
            if (tries is not None and tries.final is not None) \
                    or not zero_tail(parts, seg.offset, seg.offset + seg.size):
                raise CorruptData(
                    f"{seg.path} offset {seg.offset}: extent body checksum mismatch")
            if tries is None:
                tries = Attempts(self.visibility, seg.path)
            if not tries.again():
                raise CorruptData(
                    f"{seg.path} offset {seg.offset}: extent body checksum mismatch")
            ok, ext, payloads, parts = self._read_and_hash(seg, keep=keep)
        assert ext is not None
        if not keep:
            return ext, []
        return ext, [Record(i.record_id, p, i.codec, i.metadata, i.tokens or 0)
                     for i, p in zip(ext.local, payloads, strict=True)]

    def _read_and_hash(self, seg: SegmentRef, *, keep: bool = True) -> Pass:
        """One pass over an extent (``Pass``).  ``keep=False`` checks the same bytes but
        returns no payloads: those beyond the first read go through one scratch buffer
        of ``CHUNK`` bytes (memory bounded whatever their size), and each chunk leaves
        only its last nonzero byte in ``parts``."""
        # A small extent is read whole at once; of a large one only the start (header and
        # manifest, as a rule): its payloads are read straight into their bytes objects, so
        # what the first read holds of them is copied once more, and that must stay small.
        first = seg.size if seg.size <= CHUNK else FIRST_READ
        head = buffers.alloc(first)
        self.visibility.read_exact(seg.path, seg.offset, first, into=head, frame=True,
                                   frame_size=seg.size)
        header = self.visibility.check_header(seg, head)
        parts = [(seg.offset, head)]
        body = head[framing.HEADER_SIZE:]
        if body.nbytes < EXTENT_PREFIX.size:
            raise InvalidReference(f"{seg!r}: too small to be an extent")
        need = manifest_size(body)
        if need > header.body_length:
            return False, None, [], parts  # a manifest length that cannot be: damage or lag
        mbuf = body[:need] if need <= body.nbytes else self.visibility.read_exact(
            seg.path, seg.offset + framing.HEADER_SIZE, need)
        if need > body.nbytes:
            parts.append((seg.offset + framing.HEADER_SIZE, mbuf))
        hasher = xxhash.xxh3_128()
        hasher.update(mbuf)
        # The manifest of an extent checked before is not parsed again: the frame header
        # (checked against the reference) and the body hash below authenticate these same
        # bytes, so its cached parse describes them.
        cached = self.cache.extents.get(seg)
        raw: dict[str, Any] | None = None
        if cached is not None and cached.payload_start == need:
            lengths = [i.length for i in cached.local]
        else:
            try:
                raw, _ = decode_manifest(mbuf, f"{seg.path} offset {seg.offset}")
            except CorruptData:
                if zero_tail(parts, seg.offset, seg.offset + seg.size):
                    return False, None, [], parts  # not all of it visible yet
                raise
            lengths = [r[4] for r in raw["recs"]]
        if need + sum(lengths) != header.body_length:
            raise CorruptData(f"{seg.path} offset {seg.offset}: the manifest's records do not "
                              "fill the extent")
        payloads = self._payloads(seg, head, seg.offset + framing.HEADER_SIZE + need,
                                  lengths, hasher, parts, keep)
        if hasher.digest() != header.body_hash:
            # ``parts`` views the payloads' buffers (``fresh_bytes`` views hold no
            # reference to their bytes): returned with them, they stay alive while the
            # caller applies the zero-tail rule to ``parts``
            return False, None, payloads, parts
        if raw is None:
            assert cached is not None
            return True, cached, payloads, parts
        return True, self.remember(seg, raw, need, header.body_length), payloads, parts

    def _payloads(self, seg: SegmentRef, head: memoryview, pos: int, lengths: list[int],
                  hasher: Any, parts: list[tuple[int, memoryview]], keep: bool
                  ) -> list[bytes]:
        """Read and hash the payloads of ``lengths`` bytes from file offset ``pos`` on
        (those in ``head``, the first read, are copied from it); theirs ``bytes`` with
        ``keep``, else none."""
        payloads = []
        head_end = seg.offset + head.nbytes
        scratch = None if keep else buffers.alloc(min(CHUNK, max(lengths, default=0)))
        with self.cache.reading():  # fd stays open for this loop
            fd = self.cache.fd(seg.path)
            for n in lengths:
                if pos + n <= head_end:  # wholly in the first read: a small copy
                    piece = head[pos - seg.offset:pos + n - seg.offset]
                    hasher.update(piece)
                    if keep:
                        payloads.append(bytes(piece))
                    pos += n
                elif scratch is not None:
                    pos = self._hash_through(fd, seg, head, head_end, pos, n, hasher,
                                             scratch, parts)
                else:
                    payloads.append(self._read_payload(fd, seg, head, head_end, pos, n,
                                                       hasher, parts))
                    pos += n
        return payloads

    def _read_payload(self, fd: int, seg: SegmentRef, head: memoryview, head_end: int,
                      pos: int, n: int, hasher: Any,
                      parts: list[tuple[int, memoryview]]) -> bytes:
        """The payload of ``n`` bytes at file offset ``pos`` (its start may lie in
        ``head``), read straight into its ``bytes`` in chunks, each hashed at once."""
        data, view = fresh_bytes(n)
        k = max(0, head_end - pos)  # bytes of it already in the first read
        if k:
            view[:k] = head[pos - seg.offset:]
            hasher.update(view[:k])
        done = k
        while done < n:
            m = min(CHUNK, n - done)
            chunk = view[done:done + m]
            self.visibility.fill(fd, seg.path, chunk, pos + done)
            hasher.update(chunk)
            done += m
        parts.append((pos + k, view[k:]))
        return data

    def _hash_through(self, fd: int, seg: SegmentRef, head: memoryview, head_end: int,
                      pos: int, n: int, hasher: Any, scratch: memoryview,
                      parts: list[tuple[int, memoryview]]) -> int:
        """Hash the payload of ``n`` bytes at file offset ``pos`` (its start may lie in
        ``head``, the first read) through ``scratch``, keeping nothing of it; returns the
        offset after it.  For the zero-tail rule each chunk adds its last nonzero byte
        to ``parts`` (``zero_tail`` needs only the last nonzero position)."""
        k = max(0, head_end - pos)  # bytes of it already in the first read
        if k:
            hasher.update(head[pos - seg.offset:])
        done = k
        while done < n:
            m = min(len(scratch), n - done)
            chunk = scratch[:m]
            self.visibility.fill(fd, seg.path, chunk, pos + done)
            hasher.update(chunk)
            if chunk[m - 1]:  # the common case: no scan
                parts.append((pos + done + m - 1, memoryview(bytes(chunk[m - 1:m]))))
            else:
                rev: Any = np.frombuffer(chunk, dtype=np.uint8)[::-1]
                back = int(np.argmax(rev != 0))
                if rev[back]:
                    at = m - 1 - back
                    parts.append((pos + done + at, memoryview(bytes(chunk[at:at + 1]))))
            done += m
        return pos + n

    def confirm_published(self, segs: Sequence[SegmentRef]) -> list[bool]:
        """Which of ``segs`` (canonical, structurally checked) are confirmed to name a
        publication by their frame headers, read in bulk: per pack, one read spans
        neighbouring extents' headers (at most ``BULK_GAP`` bytes apart, ``BULK_SPAN`` in
        all).  Confirmed means a valid extent frame of the reference's size and checksum
        (``check_frame``'s condition); anything else is False, never an error."""
        run_id = self.visibility.run_id
        out = [False] * len(segs)
        by_pack: dict[str, list[int]] = {}
        for i, seg in enumerate(segs):
            if seg in self.cache.extents:  # its manifest was checked already
                out[i] = True
            elif seg.run_id == run_id and seg.size >= framing.HEADER_SIZE \
                    + EXTENT_PREFIX.size:
                by_pack.setdefault(seg.path, []).append(i)
        for path, idx in by_pack.items():
            check_pack_path(path, run_id)
            idx.sort(key=lambda i: segs[i].offset)
            start = 0
            for k in range(1, len(idx) + 1):
                if k < len(idx):
                    prev, cur = segs[idx[k - 1]].offset, segs[idx[k]].offset
                    if cur - (prev + framing.HEADER_SIZE) <= BULK_GAP \
                            and cur - segs[idx[start]].offset <= BULK_SPAN:
                        continue
                self._confirm_span(path, [segs[i] for i in idx[start:k]], idx[start:k], out)
                start = k
        return out

    def _confirm_span(self, path: str, segs: list[SegmentRef], idx: list[int],
                      out: list[bool]) -> None:
        lo = segs[0].offset
        buf = buffers.alloc(segs[-1].offset + framing.HEADER_SIZE - lo)
        try:
            with self.cache.reading():
                n = self.visibility.fs.readinto(self.cache.fd(path), buf, lo)
        except OSError:
            return  # check_published decides (missing, not visible yet, ...)
        for i, seg in zip(idx, segs, strict=True):
            at = seg.offset - lo
            if at + framing.HEADER_SIZE > n:
                break
            try:
                header = framing.decode_header(buf[at:at + framing.HEADER_SIZE])
            except (StrawError, framing.TornFrame):  # check_published names it
                continue
            out[i] = header.kind == framing.KIND_EXTENT and header.frame_length == seg.size \
                and header.body_hash.hex() == seg.checksum
