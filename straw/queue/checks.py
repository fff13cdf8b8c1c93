"""Argument checks and small pure helpers shared by the queue's calls.

Every call checks its arguments before anything is adopted or journaled: identifiers are
non-empty strs of at most 1024 characters, what the journal stores as an integer is
range-checked (and refuses bools), leases have the field types leases have.  A bad
argument is a ``TypeError`` or ``ValueError`` naming it; nothing here reads the queue.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from typing import Any

import msgpack
import xxhash

from ..checks import check_count, short_repr
from ..errors import NotAnInteger
from ..pool.ref_forms import ref_to_tuple
from ..pool.refs import RecordSetRef
from ..protocol import INT64, Lease
from .tasks import RefTuple


def ref_tuple(ref: RecordSetRef) -> RefTuple:
    return ref_to_tuple(ref)  # the one stored form (straw.refs)


def digest(value: Any) -> str:
    return xxhash.xxh3_128_hexdigest(msgpack.packb(value, use_bin_type=True))


def check_id(name: str, value: object) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, got {type(value).__name__}")
    if not value or len(value) > 1024:
        raise ValueError(f"{name} must be a non-empty str of at most 1024 characters")


def check_int64(name: str, value: object) -> None:
    """A priority or scheduling key: a signed 64-bit integer (what the journal stores)."""
    if isinstance(value, bool) or not isinstance(value, int):
        # both a TypeError (ours) and a ValueError (straw-queue's class for it)
        raise NotAnInteger(f"{name} must be a signed 64-bit integer (-2**63..2**63-1), got "
                           f"{type(value).__name__} {short_repr(value)}"
                           + (" (a bool is not a number here)" if isinstance(value, bool)
                              else ""))
    if not INT64[0] <= value <= INT64[1]:
        raise ValueError(f"{name} must be a signed 64-bit integer (-2**63..2**63-1), got "
                         f"{short_repr(value)}")


def int_or_none(text: str) -> int | None:
    try:
        return int(text)
    except ValueError:
        return None


def check_lease_fields(lease: object, where: str) -> Lease:
    """A Lease whose fields have the types leases have (what a caller may have rebuilt
    from a dict; a dict of ``asdict(lease)`` is taken too): TypeError/ValueError naming the
    field otherwise."""
    if isinstance(lease, Mapping):
        lease = Lease.from_dict(lease)
    if not isinstance(lease, Lease):
        raise TypeError(f"{where} must be a Lease, got {type(lease).__name__}")
    for name in ("run_id", "queue_id", "task_id", "attempt_id", "coordinator_epoch", "token",
                 "worker_id"):
        if not isinstance(getattr(lease, name), str):
            raise TypeError(f"{where}.{name} must be a str, got "
                            f"{type(getattr(lease, name)).__name__}")
    check_count(f"{where}.generation", lease.generation)
    return lease


def ref_dict(ref: RecordSetRef | None) -> dict[str, Any] | None:
    return None if ref is None else dataclasses.asdict(ref)


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def plain(value: Any) -> Any:
    """A dataclass reply as a dict (straw-queue's state views are plain JSON values)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    return value


def usage_of(refs: Iterable[RecordSetRef | None]) -> dict[str, int]:
    """Bytes, records and tokens of ``refs`` (payload bytes and tokens where the
    reference carries them, else the extent's size)."""
    out = {"bytes": 0, "records": 0, "tokens": 0}
    for ref in refs:
        if ref is None:
            continue
        out["bytes"] += getattr(ref, "payload_bytes", ref.size)
        out["records"] += ref.records
        out["tokens"] += getattr(ref, "tokens", 0) or 0
    return out
