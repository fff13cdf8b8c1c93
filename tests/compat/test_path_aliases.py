"""A reference may spell its pack's path through a symbolic link inside the pool (a file
link, a linked directory, a chain), as straw-queue allows: it reads, retains, pins and
depends like the canonical reference, with one identity for GC.  A link that leaves
the pool root is refused, even when what it points at is valid straw data."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest

from straw import Record, SharedFilesystemStore
from straw.errors import InvalidReference


def _moved(ref, path):  # type: ignore[no-untyped-def]
    seg = dataclasses.replace(ref.segment, path=path)
    if hasattr(ref, "manifest"):
        return dataclasses.replace(ref, manifest=dataclasses.replace(ref.manifest, segment=seg))
    return dataclasses.replace(ref, segment=seg)


def _alias(root: Path, ref, kind: str):  # type: ignore[no-untyped-def]
    canonical = Path(ref.segment.path)
    if kind == "directory":
        (root / "linked").symlink_to(canonical.parent, target_is_directory=True)
        return _moved(ref, f"linked/{canonical.name}")
    if kind == "chain":
        (root / "hop.pack").symlink_to(canonical)
        (root / "alias.pack").symlink_to("hop.pack")
    else:
        (root / "alias.pack").symlink_to(canonical)
    return _moved(ref, "alias.pack")


@pytest.mark.parametrize("kind", ["file", "directory", "chain"])
@pytest.mark.parametrize("api", ["record", "publication"])
def test_alias_reads_and_retains_the_canonical_pack_across_reopen(tmp_path, kind, api):
    with SharedFilesystemStore(tmp_path, "aliases", segment_target_bytes=0) as store:
        rec = Record("r", b"x" * 1000)
        ref = (store.write_records([rec], submission_id="s")[0] if api == "record"
               else store.publish([rec], submission_id="s"))
        alias = _alias(tmp_path, ref, kind)
        got = store.read_record(alias) if api == "record" else next(store.read(alias))
        assert got.payload == rec.payload
        store.retain("reader", [alias])
        store.release_publications([ref])
        assert store.collect_garbage()["reclaimed_files"] == 0
    with SharedFilesystemStore(tmp_path, "aliases") as fresh:
        # the owner holds the canonical pack (one identity), whichever spelling retained it
        assert fresh.collect_garbage()["reclaimed_files"] == 0
        got = fresh.read_record(alias) if api == "record" else next(fresh.read(alias))
        assert got.payload == rec.payload
        assert fresh.release("reader")
        result = fresh.collect_garbage()
        assert result["reclaimed_files"] == 1
        assert result["tombstoned"] == [ref.segment.path]
        # the dangling alias now names a reclaimed pack
        with pytest.raises(InvalidReference, match="reclaimed"):
            fresh.read_record(alias) if api == "record" else fresh.read(alias)


def test_alias_dependency_keeps_its_source(tmp_path):
    with SharedFilesystemStore(tmp_path, "aliases", segment_target_bytes=0) as store:
        source = store.publish([Record("source", b"dependency")], submission_id="source")
        alias = _alias(tmp_path, source, "file")
        dependent = store.publish([Record("result", b"result")], dependencies=[alias],
                                  submission_id="dependent")
        assert store.manifest(dependent)["dependencies"] == [source.to_dict()]
        store.release_publications([source])
        assert store.collect_garbage()["reclaimed_files"] == 0
        assert next(store.read(alias)).payload == b"dependency"
        with store.pin([alias]):
            assert store.validate(alias)
        store.release_publications([dependent])
        # with segment_target_bytes=0 the last pack is full: collection seals it first
        assert store.collect_garbage()["reclaimed_files"] == 2


def test_segment_info_through_an_alias(tmp_path):
    with SharedFilesystemStore(tmp_path, "aliases") as store:
        ref = store.publish([Record("r", b"abc")], submission_id="s")
        alias = _alias(tmp_path, ref, "directory")
        assert store.inspect_segment(alias.segment, verify_payload=True) == \
            store.inspect_segment(ref.segment)
        with store.read_session() as session:
            assert [r.payload for r in session.read(alias)] == [b"abc"]


def test_alias_leaving_the_pool_root_is_refused(tmp_path):
    root, outside = tmp_path / "pool", tmp_path / "outside"
    with SharedFilesystemStore(root, "aliases") as store:
        ref = store.publish([Record("r", b"abc")], submission_id="s")
        # a valid copy of the pool's data outside the root: following the link would read
        shutil.copytree(root, outside, symlinks=True)
        (root / "escape.pack").symlink_to(outside / ref.segment.path)
        (root / "out").symlink_to(outside / "runs", target_is_directory=True)
        for path in ("escape.pack", "out/" + ref.segment.path.split("/", 1)[1],
                     "../outside/" + ref.segment.path, str(outside / ref.segment.path)):
            bad = _moved(ref, path)
            for call in (store.read, store.validate, lambda r: store.retain("o", [r])):
                with pytest.raises(InvalidReference):
                    call(bad)
        assert store.collect_garbage()["owners"] == 0
        os.unlink(outside / ref.segment.path)  # the copy was never needed
        assert next(store.read(ref)).payload == b"abc"


def test_alias_to_something_that_is_not_a_pack_is_refused(tmp_path):
    with SharedFilesystemStore(tmp_path, "aliases") as store:
        ref = store.publish([Record("r", b"abc")], submission_id="s")
        (tmp_path / "marker.pack").symlink_to("POOL")
        (tmp_path / "loop.pack").symlink_to("loop.pack")
        for path in ("marker.pack", "loop.pack", "missing.pack"):
            with pytest.raises(InvalidReference):
                store.read(_moved(ref, path))
