"""Framing (D6): a torn frame is told apart from a corrupt one."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from straw import CorruptData, UnsupportedSchema
from straw import framing as fr


def _frame(body: bytes, group_start: int = 0, kind: int = fr.KIND_LOG) -> bytes:
    return fr.encode_frame(kind, body, group_start=group_start)


def _reader(data: bytes):  # type: ignore[no-untyped-def]
    return lambda off, n: data[off:off + n]


@given(st.binary(max_size=300))
def test_round_trip(body):
    header, got = fr.decode_frame(_frame(body))
    assert bytes(got) == body and header.kind == fr.KIND_LOG


def test_every_prefix_is_torn_and_every_bit_flip_is_corrupt():
    frame = _frame(b"some body bytes" * 3)
    for cut in range(len(frame)):
        with pytest.raises(fr.TornFrame):
            fr.decode_frame(frame[:cut])
    for i in range(len(frame)):
        for bit in range(8):
            damaged = bytearray(frame)
            damaged[i] ^= 1 << bit
            with pytest.raises((CorruptData, fr.TornFrame)) as info:
                fr.decode_frame(damaged)
            # a flip in the length field may make the frame look longer (torn) — but it
            # is never accepted; any other flip is corruption
            if info.type is fr.TornFrame:
                assert 8 <= i < 16
            else:
                assert info.type is CorruptData


def test_zero_copy_header_matches_whole_frame():
    parts = [b"abc", memoryview(b"defg"), bytearray(b"h")]
    assert fr.encode_header(fr.KIND_EXTENT, parts, group_start=7) + b"abcdefgh" == \
        fr.encode_frame(fr.KIND_EXTENT, b"abcdefgh", group_start=7)


def test_scan_clean_end_reserved_zeros_and_seal():
    a = _frame(b"a" * 10, 0)
    b = _frame(b"b" * 10, len(a))
    data = a + b + bytes(4096)
    res = fr.scan_frames(_reader(data), len(data))
    assert [f.offset for f in res.frames] == [0, len(a)]
    assert not res.torn and not res.sealed and res.end == len(a) + len(b)
    seal = fr.encode_frame(fr.KIND_SEAL, b"s", group_start=len(a + b))
    data = a + b + seal + b"trailing"
    res = fr.scan_frames(_reader(data), len(data))
    assert res.sealed and res.end == len(a + b + seal)


def test_scan_torn_final_group_is_cut():
    a = _frame(b"a" * 40, 0)
    g = len(a)  # one unsynced write group of two frames
    b = _frame(b"b" * 40, g)
    c = _frame(b"c" * 40, g)
    whole = a + b + c
    # every prefix, and garbage over any part of the final group
    for cut in range(len(a), len(whole)):
        data = whole[:cut]
        res = fr.scan_frames(_reader(data), len(data))
        assert [f.offset for f in res.frames][:1] == [0]
        assert all(f.offset < cut for f in res.frames)
    for start in range(len(a), len(whole), 7):
        data = bytearray(whole)
        data[start:start + 16] = bytes((x * 37 + 11) % 256 for x in range(16))
        res = fr.scan_frames(_reader(bytes(data)), len(data))
        assert res.frames[0].offset == 0
        # frames of the damaged group may or may not survive, but a later valid frame of
        # the same group never turns the damage into "corruption"


def test_scan_damage_followed_by_a_later_group_is_corruption():
    a = _frame(b"a" * 40, 0)
    b = _frame(b"b" * 40, len(a))
    data = bytearray(a + b)
    data[20] ^= 0xFF  # inside a's header: a was synced before b's group started
    with pytest.raises(CorruptData, match="later write group"):
        fr.scan_frames(_reader(bytes(data)), len(data))
    data = bytearray(a + b)
    data[len(a) - 3] ^= 0xFF  # inside a's body
    with pytest.raises(CorruptData):
        fr.scan_frames(_reader(bytes(data)), len(data))
    data = bytearray(a + b)
    data[0:fr.HEADER_SIZE] = bytes(fr.HEADER_SIZE)  # a synced header lost to zeros
    with pytest.raises(CorruptData):
        fr.scan_frames(_reader(bytes(data)), len(data))


def test_unknown_version_and_kind_are_unsupported():
    import struct

    import xxhash

    frame = bytearray(_frame(b"x"))
    for field, value in ((1, 9), (2, 999)):
        fields = list(struct.unpack_from("<4sHHQQ16s16s", frame))
        fields[field] = value
        first = struct.pack("<4sHHQQ16s", *fields[:6])
        damaged = first + xxhash.xxh3_128_digest(first) + frame[fr.HEADER_SIZE:]
        with pytest.raises(UnsupportedSchema):
            fr.decode_frame(damaged)
