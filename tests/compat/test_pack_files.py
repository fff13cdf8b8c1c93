"""The pool's pack files are ``*.pack``, as straw-queue's, and a pack's size is what was
written to it: callers (vime's tests) measure what a step wrote by summing the sizes of
``root.rglob("*.pack")``.  Space is reserved past the end of file, never by growing it."""

from __future__ import annotations

from pathlib import Path

from straw import Record, SharedFilesystemStore


def _pack_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*.pack"))


def test_pack_sizes_follow_what_was_written_publication_by_publication(tmp_path):
    store = SharedFilesystemStore(tmp_path, "sizes")
    before = _pack_bytes(tmp_path)
    refs = [store.publish([Record(f"g{i}", bytes([i % 251]) * 40)], submission_id=f"g{i}")
            for i in range(32)]
    first = _pack_bytes(tmp_path) - before
    # the one pack holds its header and the extents, and nothing reserved
    assert first == refs[-1].offset + refs[-1].size
    more = [store.publish([Record(f"h{i}", bytes([i % 251]) * 40)], submission_id=f"h{i}")
            for i in range(32)]
    second = _pack_bytes(tmp_path) - before
    assert second - first == sum(ref.size for ref in more)  # each byte written, no more
    assert second < 2.5 * first  # linear in what was written
    refs += more
    assert {Path(ref.path).suffix for ref in refs} == {".pack"}
    store.close()  # sealing adds the pack's index; the reservation is released
    assert _pack_bytes(tmp_path) - before >= second


def test_a_packs_bytes_once_there_never_change(tmp_path):
    # vime checks that a step leaves every byte the pool's *.pack files held unchanged
    # (append-only, as straw-queue's segment files): no reserved zeros are ever exposed
    # and overwritten later
    store = SharedFilesystemStore(tmp_path, "append")
    store.publish([Record("a", b"a" * 10)], submission_id="a")
    held = {p: p.read_bytes() for p in tmp_path.rglob("*.pack")}
    for i in range(20):
        store.publish([Record(f"b{i}", b"b" * (i * 300))], submission_id=f"b{i}")
    store.close()
    assert held and all(p.read_bytes()[:len(data)] == data for p, data in held.items())
