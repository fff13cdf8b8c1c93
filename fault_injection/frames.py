"""The frame campaign: torn and corrupted bytes of every frame type, and of whole packs.

Role: check D6 at the byte level, exhaustively for small inputs.  Frames are taken from a
real pack written by the store on SimFS (pack header, extents, seal) and from an
``AckLog`` (log entry), so the campaign follows the layout the engine really writes.

* Every proper byte prefix of a frame -> ``framing.decode_frame`` raises ``TornFrame``.
* A bit flip at every byte (every bit for frames up to ``EVERY_BIT_LIMIT`` bytes, one
  bit per byte beyond) -> ``CorruptData``.  Nothing is silently accepted, and no flip is
  mistaken for a torn frame.
* File level, an unsealed pack of several write groups: every byte prefix (also followed
  by reserved zeros) scans without error to exactly the complete frames of the prefix; a
  flipped byte inside a frame of any group but the last (synced, then damaged) ->
  ``scan_frames`` raises ``CorruptData``; a flipped byte in the last group is a torn
  tail, cut off at that group's start.
* File level, a queue journal segment (``straw.journal``: single commits, a group of
  three, an atomic batch, each acknowledged): every byte prefix scans without error to
  the complete frames of the prefix; a flipped byte in any frame but the final confirm
  record -- every acknowledged transaction included, the last one too (D6: it may have
  been acknowledged) -> ``CorruptData``; in the final confirm -> a torn tail there.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fault_injection.simfs import SimFS
from fault_injection.workloads import ROOT, StoreParams, rec
from straw import Publication, framing
from straw import journal as journal_mod
from straw.clock import ManualClock
from straw.errors import CorruptData
from straw.publication_log import AckLog

EVERY_BIT_LIMIT = 2048


@dataclass
class FrameReport:
    checks: int = 0
    violations: list[str] = field(default_factory=list)
    seconds: float = 0.0

    def fail(self, msg: str) -> None:
        self.violations.append(msg)


def _pack_bytes(seal: bool) -> tuple[bytes, list[int]]:
    """A pack written by the store (no reservation): its bytes and the offsets of its
    frames, grouped: returns (bytes, group starts in file order)."""
    sim = SimFS(0)
    store = StoreParams(reserve_bytes=0).open(sim)
    a = store.publish([rec("fa", 300)], submission_id="fa")
    store.publish_many([Publication([rec("fb", 1200), rec("fb2", 0)]),
                        Publication([rec("fc", 40)], dependencies=(0, a))],
                       submission_id="fbc")
    store.publish([rec("fd", 2100, meta=True)], submission_id="fd")
    store.publish_many([Publication([rec("fe", 64)]), Publication([rec("ff", 90)], (0,))],
                       submission_id="fef")
    path = f"{ROOT}/{a.path}"
    if seal:
        store.close()
    data = sim.files()[path]
    if not seal:
        store.close()
    scan = framing.scan_frames(lambda o, n: data[o:o + n], len(data))
    return data, sorted({f.header.group_start for f in scan.frames})


def sample_frames() -> dict[str, bytes]:
    """One frame of each type (two extents: one record, several records)."""
    data, _ = _pack_bytes(seal=True)
    scan = framing.scan_frames(lambda o, n: data[o:o + n], len(data))
    out: dict[str, bytes] = {}
    for f in scan.frames:
        raw = data[f.offset:f.offset + f.header.frame_length]
        if f.header.kind == framing.KIND_PACK_HEADER:
            out["pack-header"] = raw
        elif f.header.kind == framing.KIND_SEAL:
            out["seal"] = raw
        elif f.header.kind == framing.KIND_EXTENT:
            out.setdefault("extent" if "extent" not in out else "extent-batch", raw)
    sim = SimFS(0)
    log = AckLog(sim, "/acks.log")
    log.append({"sid": "x", "refs": [{"path": "p", "offset": 56}], "seed": 7})
    log.close()
    out["log"] = sim.files()["/acks.log"]
    return out


def _decode_outcome(buf: bytes) -> str:
    try:
        framing.decode_frame(buf)
    except framing.TornFrame:
        return "torn"
    except CorruptData:
        return "corrupt"
    except Exception as e:  # anything else is a violation, reported by its name
        return f"{type(e).__name__}: {e}"
    return "accepted"


def check_frame(name: str, frame: bytes, report: FrameReport) -> None:
    outcome = _decode_outcome(frame)
    report.checks += 1
    if outcome != "accepted":
        report.fail(f"{name}: the intact frame decodes as {outcome}")
    for n in range(len(frame)):
        report.checks += 1
        outcome = _decode_outcome(frame[:n])
        if outcome != "torn":
            report.fail(f"{name}: prefix of {n}/{len(frame)} bytes -> {outcome}, expected torn")
            return
    every_bit = len(frame) <= EVERY_BIT_LIMIT
    buf = bytearray(frame)
    for i in range(len(frame)):
        for bit in range(8) if every_bit else (i % 8,):
            buf[i] ^= 1 << bit
            outcome = _decode_outcome(bytes(buf))
            buf[i] ^= 1 << bit
            report.checks += 1
            if outcome != "corrupt":
                report.fail(f"{name}: bit {bit} of byte {i} flipped -> {outcome}, "
                            "expected corrupt")
                return


def _scan(data: bytes | bytearray, size: int) -> framing.ScanResult:
    view = bytes(data)
    return framing.scan_frames(lambda o, n: view[o:min(o + n, size)], size)

def _flipped_outcome(data: bytearray, i: int) -> str:
    """What ``_scan`` makes of ``data`` with byte ``i`` flipped ("corrupt", "torn at N",
    "accepted (end N)" or an unexpected error); ``data`` is restored afterwards."""
    data[i] ^= 0x10
    try:
        res = _scan(data, len(data))
        return f"torn at {res.end}" if res.torn else f"accepted (end {res.end})"
    except CorruptData:
        return "corrupt"
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    finally:
        data[i] ^= 0x10



def check_pack_file(report: FrameReport) -> None:
    data, groups = _pack_bytes(seal=False)
    full = _scan(data, len(data))
    offsets = [f.offset for f in full.frames]
    ends = [f.offset + f.header.frame_length for f in full.frames]
    if full.torn or ends[-1] != len(data):
        report.fail(f"the intact pack scans as torn={full.torn} end={full.end}")
        return
    # every prefix, bare and followed by reserved zeros: torn (or clean) tail, never corrupt
    for n in range(len(data) + 1):
        complete = [o for o, e in zip(offsets, ends, strict=True) if e <= n]
        for tail in (0, 700):
            report.checks += 1
            buf = data[:n] + bytes(tail)
            try:
                got = [f.offset for f in _scan(buf, len(buf)).frames]
            except Exception as e:
                report.fail(f"pack prefix of {n} bytes (+{tail} zeros) -> "
                            f"{type(e).__name__}: {e}; a torn tail must be cut off")
                return
            if got != complete:
                report.fail(f"pack prefix of {n} bytes (+{tail} zeros): frames {got}, "
                            f"expected {complete}")
                return
    # a flipped byte: corrupt if a valid frame of a later write group follows, else a
    # torn tail (cut off at the damaged frame)
    last_group = groups[-1]
    flipped = bytearray(data)
    for i in range(len(data)):
        report.checks += 1
        outcome = _flipped_outcome(flipped, i)
        # in the last group: torn at the damaged frame (its valid predecessors stay)
        start = max(o for o in offsets if o <= i)
        want = "corrupt" if i < last_group else f"torn at {start}"
        if outcome != want:
            report.fail(f"pack byte {i} flipped (last group starts at {last_group}) -> "
                        f"{outcome}, expected {want}")
            return


def _journal_bytes() -> bytes:
    """A journal segment written by ``straw.journal`` (no reservation): seven
    acknowledged transaction frames."""
    sim = SimFS(0)
    r = journal_mod.recover(sim, "/j")
    j = journal_mod.Journal(sim, "/j", epoch=1, recovered=r, clock=ManualClock(),
                            reserve_bytes=0)
    j.commit(b"one")
    j.commit(b"")
    seq = 0
    for t in (b"g1" * 40, b"g2", b"g3" * 300):
        seq = j.enqueue(t)
    j.wait(seq)
    j.commit_many([b"m1" * 9, b"m2"])
    j.commit(b"last" * 50)
    j.close()
    return sim.files()[f"/j/{journal_mod.segment_name(1, 1)}"]


def check_journal_file(report: FrameReport) -> None:
    data = _journal_bytes()
    full = _scan(data, len(data))
    offsets = [f.offset for f in full.frames]
    ends = [f.offset + f.header.frame_length for f in full.frames]
    txn_tags = (journal_mod.REC_TXN, journal_mod.REC_BATCH)
    acked = [(f.offset, f.offset + f.header.frame_length) for f in full.frames
             if f.body[0] in txn_tags]
    if full.torn or not ends or ends[-1] != len(data) or len(acked) != 7:
        report.fail(f"the intact journal segment scans as torn={full.torn} end={full.end} "
                    f"with {len(acked)} transaction frames")
        return
    for n in range(len(data) + 1):
        report.checks += 1
        complete = [o for o, e in zip(offsets, ends, strict=True) if e <= n]
        try:
            got = [f.offset for f in _scan(data, n).frames]
        except Exception as e:
            report.fail(f"journal prefix of {n} bytes -> {type(e).__name__}: {e}; a torn "
                        "tail must be cut off")
            return
        if got != complete:
            report.fail(f"journal prefix of {n} bytes: frames {got}, expected {complete}")
            return
    # every byte up to the last acknowledged frame's end: corrupt, whatever frame holds
    # it; after that, only the final confirm (not synced by itself): a torn tail there
    last_acked_end = acked[-1][1]
    flipped = bytearray(data)
    for i in range(len(data)):
        report.checks += 1
        outcome = _flipped_outcome(flipped, i)
        want = "corrupt" if i < last_acked_end else f"torn at {last_acked_end}"
        if outcome != want:
            report.fail(f"journal byte {i} flipped (the last acknowledged transaction ends "
                        f"at {last_acked_end}) -> {outcome}, expected {want}")
            return


def run_frame_campaign(log: Callable[[str], None] = print) -> FrameReport:
    t0 = time.perf_counter()
    report = FrameReport()
    frames = sample_frames()
    for name, frame in frames.items():
        check_frame(name, frame, report)
    check_pack_file(report)
    check_journal_file(report)
    report.seconds = time.perf_counter() - t0
    return report
