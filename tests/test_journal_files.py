"""Reading a queue journal's files (straw.journal_files): a segment is read up to its
clean end, never to the end of a sparse tail, and no journal file is read through a
symbolic link."""

from __future__ import annotations

import os

import pytest

from straw.clock import ManualClock
from straw.errors import CorruptData
from straw.fs import PosixFS
from straw.journal import Journal, recover, segment_name
from straw.journal_files import CLEAN_RUN

HUGE = 1 << 30  # a sparse tail: no disk blocks, but a read to the end would hold it all


def _journal(d: str, txns: list[bytes], *, snapshot: bool = False) -> None:
    fs = PosixFS()
    r = recover(fs, d)
    j = Journal(fs, d, epoch=r.last_epoch + 1, recovered=r, clock=ManualClock())
    for t in txns:
        j.commit(t)
    if snapshot:
        j.snapshot(b"state")
        j.commit(b"after")
    j.close()


def _extend(path: str, size: int = HUGE) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def test_a_sparse_tail_is_not_read(tmp_path):
    d = str(tmp_path / "journal")
    txns = [b"a", os.urandom(3000), b"c"]
    _journal(d, txns)
    before = recover(PosixFS(), d)
    _extend(os.path.join(d, segment_name(1, 1)))
    r = recover(PosixFS(), d)
    assert r.transactions == txns and r.cutoffs == before.cutoffs
    assert not r.stats["torn_tail"]
    assert r.stats["bytes_read"] < before.stats["bytes_read"] + 2 * CLEAN_RUN + (1 << 20)
    _journal(d, [b"d"])  # the next epoch starts after the frames, its cutoff there
    assert recover(PosixFS(), d).transactions == [*txns, b"d"]


def test_zero_bytes_inside_a_transaction_do_not_end_the_read(tmp_path):
    d = str(tmp_path / "journal")
    txns = [b"a", bytes(3 * CLEAN_RUN), b"b" * 100, bytes(CLEAN_RUN + 1), b"c"]
    _journal(d, txns)
    _extend(os.path.join(d, segment_name(1, 1)))
    assert recover(PosixFS(), d).transactions == txns


def test_a_torn_tail_before_a_sparse_tail_is_still_torn(tmp_path):
    d = str(tmp_path / "journal")
    _journal(d, [b"a", b"b"])
    path = os.path.join(d, segment_name(1, 1))
    end = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(end)
        f.write(b"STRW" + os.urandom(40))  # a write group cut by a power loss
    _extend(path)
    r = recover(PosixFS(), d)
    assert r.transactions == [b"a", b"b"] and r.stats["torn_tail"]
    assert r.cutoffs[1] == (1, end)


def test_damage_followed_by_later_frames_is_still_corrupt(tmp_path):
    d = str(tmp_path / "journal")
    _journal(d, [b"first transaction", b"b", b"c"])
    path = os.path.join(d, segment_name(1, 1))
    data = bytearray(open(path, "rb").read())
    at = data.index(b"first transaction")
    data[at] ^= 0xFF
    with open(path, "r+b") as f:
        f.write(data)
    _extend(path)
    with pytest.raises(CorruptData, match="later write group"):
        recover(PosixFS(), d)


@pytest.mark.parametrize("which", ["segment", "snapshot", "journal directory"])
def test_a_journal_file_is_never_read_through_a_symlink(tmp_path, which):
    here, other = str(tmp_path / "a" / "journal"), str(tmp_path / "b" / "journal")
    _journal(here, [b"ours"], snapshot=True)
    _journal(other, [b"theirs"], snapshot=True)
    if which == "journal directory":
        name = "journal"
        os.rename(here, here + ".moved")
        os.symlink(other, here)
    else:
        name = next(n for n in os.listdir(here)
                    if n.endswith(".snap" if which == "snapshot" else ".log"))
        os.unlink(os.path.join(here, name))
        os.symlink(os.path.join(other, name), os.path.join(here, name))
    with pytest.raises(CorruptData, match=f"{name}.*symbolic link"):
        recover(PosixFS(), here)
