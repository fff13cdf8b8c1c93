"""The builder's JSON records: canonical encoding, digests, the schema names of its
collections, plans and ready records, and the one way it reads a JSON record back
(``CorruptData`` unless the publication is one valid ``json.v1`` record)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from straw.errors import CorruptData
from straw.refs import Record, RecordSetRef

COLLECTION_PREFIX = "collection:"
BUILDER_WORKER = "batch-builder"
PLAN_SCHEMA = "straw.rollout.plan"
READY_SCHEMA = "straw.rollout.ready"
COLLECTION_SCHEMA = "straw.rollout.collection"


def canonical(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"),
                      allow_nan=False).encode()


def digest(value: Any) -> str:
    return hashlib.sha256(canonical(value)).hexdigest()[:32]


def json_record(record_id: str, value: Any, metadata: Mapping[str, Any] | None = None
                ) -> Record:
    return Record(record_id, canonical(value), "json.v1", dict(metadata or {}))


def hook_name(hook: Any) -> str | None:
    """A hook's identity in the plan digest: changing the hook changes the plan."""
    if hook is None:
        return None
    return f"{getattr(hook, '__module__', '?')}.{getattr(hook, '__qualname__', repr(hook))}"


def read_json(store: Any, ref: RecordSetRef, what: str) -> Any:
    """The JSON value of the one ``json.v1`` record published at ``ref``."""
    records = list(store.read(ref))
    if len(records) != 1 or records[0].codec != "json.v1":
        raise CorruptData(f"{what} {ref!r} is not one json.v1 record")
    try:
        return json.loads(bytes(records[0].payload))
    except ValueError as e:
        raise CorruptData(f"{what} {ref!r} is not valid JSON: {e}") from None


__all__ = ["COLLECTION_PREFIX", "BUILDER_WORKER", "PLAN_SCHEMA", "READY_SCHEMA",
           "COLLECTION_SCHEMA", "canonical", "digest", "json_record", "hook_name",
           "read_json"]
