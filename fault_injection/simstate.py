"""The durability model behind SimFS: inodes, what is durable vs only in the page cache,
and what a power loss keeps.

Role: pure in-memory state with no notion of handles, clients or injected errors (those
are ``fault_injection.simfs``).  Invariants it upholds:

* ``FileNode.durable`` changes only in ``sync_file`` (all pending data ops, in order) and
  in ``crash`` (the surviving subset chosen by the variant); nothing else makes data
  durable.  ``DirNode.durable_entries`` changes only when a namespace op is forced by
  ``force_dir`` (``fsync_dir``) or survives a ``crash``.
* ``force_dir(D)`` forces every pending namespace op naming D and, transitively, the
  earlier ops it depends on: the same inode, the same ``(dir, name)`` slot, or the
  creation/move of a directory it names.  Unrelated directories stay undurable.
* ``crash`` never invents bytes: everything it writes comes from a pending write, zero
  fill past the old end, or (torn-op only) a garbage sector inside a pending write's
  range.
"""

from __future__ import annotations

import errno
import posixpath
import random
from typing import Any

from fault_injection.rules import raise_errno

SECTOR = 512
VARIANTS = ("clear-cache", "torn-seq", "torn-op")

# A pending data op is (seq, kind, offset_or_size, data); seq is the global issue order.
WRITE, TRUNC, EXTEND = 0, 1, 2
DataOp = tuple[int, int, int, bytes | memoryview]


class FileNode:
    """A regular file inode: page cache, durable bytes, unsynced ops, visibility, lock."""

    __slots__ = (
        "ino", "data", "durable", "pending", "flushed_size", "last_writer", "mtime_ns",
        "lock_owner",
    )  # fmt: skip

    def __init__(self, ino: int, mtime_ns: int) -> None:
        self.ino = ino
        self.data = bytearray()  # what reads see
        self.durable = bytearray()  # what survives power loss
        self.pending: list[DataOp] = []  # unsynced data ops, issue order
        self.flushed_size = 0  # bound on what other clients see (close-to-open)
        self.last_writer: str | None = None  # this client sees everything
        self.mtime_ns = mtime_ns
        self.lock_owner: Any = None  # the SimFS handle holding the lock


class DirNode:
    """A directory inode: current and durable name -> inode maps."""

    __slots__ = ("ino", "entries", "durable_entries", "mtime_ns")

    def __init__(self, ino: int, mtime_ns: int) -> None:
        self.ino = ino
        self.entries: dict[str, Node] = {}
        self.durable_entries: dict[str, Node] = {}
        self.mtime_ns = mtime_ns


Node = FileNode | DirNode
Slot = tuple[DirNode, str]


class NsOp:
    """An unsynced namespace op: unbind ``src`` (if any), bind ``dst`` (if any) to inode.
    create/mkdir: dst only; unlink: src only; rename: both."""

    __slots__ = ("seq", "inode", "src", "dst", "forced")

    def __init__(self, seq: int, inode: Node, src: Slot | None, dst: Slot | None) -> None:
        self.seq = seq
        self.inode = inode
        self.src = src
        self.dst = dst
        self.forced = False

    def applicable(self) -> bool:
        """Does the durable namespace built so far allow this op?"""
        if self.src is not None:
            return self.src[0].durable_entries.get(self.src[1]) is self.inode
        return self.dst is not None and self.dst[1] not in self.dst[0].durable_entries

    def apply(self) -> None:
        if self.src is not None:
            del self.src[0].durable_entries[self.src[1]]
        if self.dst is not None:
            self.dst[0].durable_entries[self.dst[1]] = self.inode


def norm_path(path: str) -> str:
    if not path.startswith("/"):
        raise ValueError(f"SimFS paths are absolute, got {path!r}")
    norm = posixpath.normpath(path)
    return "/" + norm.lstrip("/") if norm.startswith("//") else norm


def write_into(buf: bytearray, offset: int, data: bytes | memoryview) -> None:
    if offset > len(buf):
        buf.extend(bytes(offset - len(buf)))
    buf[offset : offset + len(data)] = data


def _resize(buf: bytearray, size: int) -> None:
    if size < len(buf):
        del buf[size:]
    elif size > len(buf):
        buf.extend(bytes(size - len(buf)))


def apply_op(buf: bytearray, op: DataOp) -> None:
    _seq, kind, arg, data = op
    if kind == WRITE:
        write_into(buf, arg, data)
    elif kind == TRUNC:
        _resize(buf, arg)
    elif arg > len(buf):  # EXTEND never shrinks
        _resize(buf, arg)


def sectors(offset: int, data: bytes | memoryview) -> list[tuple[int, memoryview]]:
    """Split a write into pieces that each lie within one 512-byte sector of the file."""
    mv = memoryview(data)
    end = offset + len(mv)
    out = []
    pos = offset
    while pos < end:
        nxt = min(end, (pos // SECTOR + 1) * SECTOR)
        out.append((pos, mv[pos - offset : nxt - offset]))
        pos = nxt
    return out


class SimState:
    """The namespace tree, the unsynced-op logs, sync and power loss."""

    def __init__(self) -> None:
        self._next_ino = 1
        self.root = DirNode(self._new_ino(), 0)
        self.seq = 0  # global issue order of unsynced ops
        self.dirty: dict[int, FileNode] = {}  # files with pending data ops
        self.ns_pending: list[NsOp] = []  # unsynced namespace ops, issue order

    def _new_ino(self) -> int:
        ino = self._next_ino
        self._next_ino += 1
        return ino

    def new_file(self, mtime_ns: int) -> FileNode:
        return FileNode(self._new_ino(), mtime_ns)

    def new_dir(self, mtime_ns: int) -> DirNode:
        return DirNode(self._new_ino(), mtime_ns)

    # --- lookups --------------------------------------------------------------------------
    def lookup(
        self, path: str, chain: list[DirNode] | None = None
    ) -> tuple[DirNode, str, Node | None]:
        """(parent directory, last name, inode or None); ENOENT/ENOTDIR on the way.
        ``chain`` collects the directories walked through (parent included)."""
        norm = norm_path(path)
        d = self.root
        if norm == "/":
            return d, "", d
        parts = norm[1:].split("/")
        for name in parts[:-1]:
            nxt = d.entries.get(name)
            if nxt is None:
                raise_errno(errno.ENOENT, path)
            if not isinstance(nxt, DirNode):
                raise_errno(errno.ENOTDIR, path)
            assert isinstance(nxt, DirNode)
            if chain is not None:
                chain.append(d)
            d = nxt
        if chain is not None:
            chain.append(d)
        return d, parts[-1], d.entries.get(parts[-1])

    def walk(self) -> list[tuple[str, Node]]:
        """Every (path, inode) reachable in the current namespace, sorted by path."""
        out: list[tuple[str, Node]] = [("/", self.root)]
        stack: list[tuple[str, DirNode]] = [("", self.root)]
        while stack:
            prefix, d = stack.pop()
            for name, node in d.entries.items():
                out.append((f"{prefix}/{name}", node))
                if isinstance(node, DirNode):
                    stack.append((f"{prefix}/{name}", node))
        return sorted(out, key=lambda pn: pn[0])

    # --- data -----------------------------------------------------------------------------
    def write(self, f: FileNode, offset: int, data: bytes, client: str, now_ns: int) -> None:
        write_into(f.data, offset, data)
        self.seq += 1
        f.pending.append((self.seq, WRITE, offset, data))
        self.dirty[f.ino] = f
        f.last_writer = client
        f.mtime_ns = now_ns

    def size_op(self, f: FileNode, kind: int, size: int, client: str, now_ns: int) -> None:
        """Truncate (``TRUNC``) or reserve up to (``EXTEND``) ``size``."""
        self.seq += 1
        op: DataOp = (self.seq, kind, size, b"")
        apply_op(f.data, op)
        f.pending.append(op)
        self.dirty[f.ino] = f
        f.last_writer = client
        f.mtime_ns = now_ns

    def sync_file(self, f: FileNode) -> None:
        """fsync/fdatasync: the pending data ops become durable, in order."""
        for op in f.pending:
            apply_op(f.durable, op)
        f.pending = []
        self.dirty.pop(f.ino, None)
        f.flushed_size = len(f.data)

    def drop_dirty(self, f: FileNode, choice: str) -> None:
        """After a failed sync: "keep" the dirty data pending, "forget" it (readable but
        never durable), or "revert" the page cache to the durable bytes."""
        if choice == "keep":
            return
        f.pending = []
        self.dirty.pop(f.ino, None)
        if choice == "revert":
            f.data = bytearray(f.durable)
            f.flushed_size = min(f.flushed_size, len(f.data))

    # --- namespace ------------------------------------------------------------------------
    def record_ns(self, inode: Node, src: Slot | None, dst: Slot | None) -> None:
        self.seq += 1
        self.ns_pending.append(NsOp(self.seq, inode, src, dst))

    def force_dir(self, d: DirNode) -> None:
        """fsync_dir: force the pending ops naming ``d`` and the earlier ops they depend on;
        apply the forced prefix of the log to the durable namespace."""
        need_inos: set[int] = set()
        slots: set[tuple[int, str]] = set()
        for op in reversed(self.ns_pending):
            if op.forced:
                continue
            hit = op.inode.ino in need_inos
            for s in (op.src, op.dst):
                if s is not None and (s[0] is d or (s[0].ino, s[1]) in slots):
                    hit = True
            if not hit:
                continue
            op.forced = True
            need_inos.add(op.inode.ino)
            for s in (op.src, op.dst):
                if s is not None:
                    slots.add((s[0].ino, s[1]))
                    need_inos.add(s[0].ino)
        k = 0
        for op in self.ns_pending:
            if not op.forced:
                break
            if op.applicable():
                op.apply()
            k += 1
        del self.ns_pending[:k]

    # --- power loss -----------------------------------------------------------------------
    def crash(self, variant: str, r: random.Random) -> str:
        """Keep what is durable plus what ``variant`` lets survive; the result becomes the
        current state (handles and locks are the caller's).  Returns a summary."""
        if variant not in VARIANTS:
            raise ValueError(f"unknown crash variant {variant!r}; known: {VARIANTS}")
        cut = -1
        tear_cut = False
        if variant == "torn-seq":
            seqs = [op[0] for f in self.dirty.values() for op in f.pending]
            seqs += [op.seq for op in self.ns_pending if not op.forced]
            seqs.sort()
            k = r.randint(0, len(seqs))
            cut = seqs[k] if k < len(seqs) else self.seq + 1
            tear_cut = r.random() < 0.5
        kept_data = total_data = garbage = 0
        for f in self.dirty.values():
            total_data += len(f.pending)
            k, g = self._crash_file(f, variant, r, cut, tear_cut)
            kept_data += k
            garbage += g
        kept_ns = total_ns = 0
        for op in self.ns_pending:
            if op.forced:
                keep = True
            else:
                total_ns += 1
                if variant == "torn-seq":
                    keep = op.seq < cut
                else:
                    keep = variant == "torn-op" and r.random() < 0.5
            if keep and op.applicable():
                op.apply()
                kept_ns += not op.forced
        self._reset_to_durable()
        return (
            f"power loss ({variant}): kept {kept_data}/{total_data} unsynced data ops, "
            f"{garbage} garbage sectors, kept {kept_ns}/{total_ns} unsynced namespace ops"
        )

    def _crash_file(
        self, f: FileNode, variant: str, r: random.Random, cut: int, tear_cut: bool
    ) -> tuple[int, int]:
        """Apply the surviving unsynced ops of ``f`` to its durable bytes; returns
        (ops kept whole, garbage sectors)."""
        buf = f.durable
        kept = garbage = 0
        if variant == "torn-seq":
            for op in f.pending:
                if op[0] < cut:
                    apply_op(buf, op)
                    kept += 1
                elif op[0] == cut and op[1] == WRITE and tear_cut:
                    pieces = sectors(op[2], op[3])
                    for off, piece in pieces[: r.randrange(len(pieces))]:
                        write_into(buf, off, piece)
        elif variant == "torn-op":
            written: list[tuple[int, memoryview]] = []
            for op in f.pending:
                if op[1] == WRITE:
                    pieces = sectors(op[2], op[3])
                    written += pieces
                    n = 0
                    for off, piece in pieces:
                        if r.random() < 0.5:
                            write_into(buf, off, piece)
                            n += 1
                    kept += n == len(pieces)
                elif r.random() < 0.5:
                    apply_op(buf, op)
                    kept += 1
            if written and r.random() < 0.5:
                off, piece = r.choice(written)
                write_into(buf, off, r.randbytes(len(piece)))
                garbage = 1
        return kept, garbage

    def _reset_to_durable(self) -> None:
        """The durable state becomes the current state; unreachable inodes are gone."""
        stack = [self.root]
        while stack:
            d = stack.pop()
            d.entries = dict(d.durable_entries)
            for node in d.entries.values():
                if isinstance(node, DirNode):
                    stack.append(node)
                else:
                    node.data = bytearray(node.durable)
                    node.pending = []
                    node.flushed_size = len(node.data)
                    node.last_writer = None
                    node.lock_owner = None
        self.dirty.clear()
        self.ns_pending.clear()
