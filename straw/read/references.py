"""Which references a read session follows: publications and records of its own run,
by their canonical pack path inside its pool.

A reference may name its pack through an in-pool alias (a symbolic link inside the
pool): the session resolves it to the pack's canonical path, by name only, and refuses a
link that leads outside the pool root (``InvalidReference``): straw never follows a
reference out of its pool.  The pack is then opened by its canonical path beneath the
root (``PackCache.fd``).
"""

from __future__ import annotations

import posixpath
from typing import Any

from ..errors import InvalidReference, WrongReferenceKind
from ..fs import Filesystem
from ..pool.ref_forms import alias_parts, canonical_ref
from ..pool.refs import PACK_PATH_RE, RecordRef, RecordSetRef, SegmentRef


class PoolReferences:
    """The reference checks of a session on the pool at ``root`` (resolved once:
    ``real_root``) for run ``run_id``."""

    def __init__(self, fs: Filesystem, root: str, real_root: str, run_id: str) -> None:
        self.fs = fs
        self.root = root
        self.real_root = real_root
        self.run_id = run_id

    def canonical(self, ref: Any) -> Any:
        """``ref`` with an in-pool alias of its pack resolved (``straw.refs.canonical_ref``);
        a canonical reference is returned as it is, without I/O."""
        return canonical_ref(ref, self.resolve_alias)

    def resolve_alias(self, path: str) -> str:
        """The canonical pack path that ``path`` (not canonical) names through symbolic
        links inside the pool, else ``path`` unchanged (the reference check then refuses
        it).  A link whose target lies outside the pool root is ``InvalidReference``.
        Only names are resolved here."""
        parts = alias_parts(path)
        if parts is None:
            return path
        try:
            real = self.fs.realpath(posixpath.join(self.real_root, *parts))
        except OSError as e:  # a loop of links, say
            raise InvalidReference(f"reference path {path!r} cannot be resolved inside the "
                                   f"pool {self.root!r}: {e}") from None
        base = self.real_root.rstrip("/") + "/"
        if not real.startswith(base):
            raise InvalidReference(
                f"reference path {path!r} leads outside the pool root {self.root!r} (to "
                f"{real!r}) through a symbolic link; straw follows references only to packs "
                "inside their pool: use the pack's own path")
        rel = real[len(base):]
        return rel if PACK_PATH_RE.match(rel) else path

    def check(self, ref: object) -> None:
        """``ref`` must be a well-formed publication (or segment) reference of this run:
        ``WrongReferenceKind`` for a record's, ``TypeError`` for anything else,
        ``InvalidReference`` for another run's."""
        if isinstance(ref, RecordRef):
            raise WrongReferenceKind(
                f"expected a RecordSetRef (a publication), got a RecordRef (one record: "
                f"{ref!r}); read one record with read_record(ref), or pass the "
                "publication's RecordSetRef (record_set(refs, ...) makes one of records)")
        if not isinstance(ref, (RecordSetRef, SegmentRef)):
            raise TypeError(f"expected a RecordSetRef, got {type(ref).__name__}")
        ref.check()
        if ref.run_id != self.run_id:
            raise InvalidReference(
                f"{ref!r} belongs to run {ref.run_id!r}, this store is run {self.run_id!r}"
            )

    def record(self, record_ref: RecordRef) -> RecordRef:
        """``record_ref``, a well-formed record reference of this run, made canonical
        (``WrongReferenceKind`` for a publication's)."""
        if isinstance(record_ref, RecordSetRef):
            raise WrongReferenceKind(
                f"expected a RecordRef (one record), got a RecordSetRef (a publication: "
                f"{record_ref!r}); read a publication with read(ref), or pass one of its "
                "records' RecordRef")
        if not isinstance(record_ref, RecordRef):
            raise TypeError(f"expected a RecordRef, got {type(record_ref).__name__}")
        record_ref = self.canonical(record_ref)
        record_ref.check()
        if record_ref.segment.run_id != self.run_id:
            self.check(record_ref.segment)  # the error naming both runs
        return record_ref
