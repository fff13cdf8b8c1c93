"""A ``TensorRef``'s dict form: its fields read from a dict (``to_dict``'s, or an earlier
straw's), and the checks of the reference they make."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

from ..checks import short_repr
from ..errors import InvalidReference
from ..pool.refs import RecordRef, RecordSetRef
from . import records
from .format import DTYPES, MAX_DIMS, SOURCES

_DEFAULT_CODECS = ("bytes.v1", "json.v1", "tensor.v1")


def fields_of(value: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a reference from its dict (absent optional fields take their
    defaults; ``chunk_bytes`` the granularity in force, ``records.CHUNK_BYTES``).  Raises
    ``KeyError``, ``TypeError`` or ``ValueError`` on a malformed dict."""
    rr, bs = value.get("record_ref"), value.get("blob_set")
    return dict(
        path=value["path"], shape=tuple(value["shape"]), dtype=value["dtype"],
        nbytes=value["nbytes"], kind=value.get("kind"),
        validated=value.get("validated", False), offset=value.get("offset", -1),
        checksum=value.get("checksum"), codecs=tuple(value.get("codecs", _DEFAULT_CODECS)),
        record_ref=None if rr is None else RecordRef.from_dict(rr),
        root=value.get("root", ""), run_id=value.get("run_id", ""),
        blob_set=None if bs is None else RecordSetRef.from_dict(bs),
        blob_ordinal=value.get("blob_ordinal", 0), source=value.get("source", ""),
        chunk_bytes=value.get("chunk_bytes", records.CHUNK_BYTES),
        pool_id=value.get("pool_id"))


def check_fields(ref: Any, value: Mapping[str, Any]) -> None:
    """``InvalidReference`` unless the reference made from ``value`` has fields of the
    right types and ranges."""
    if not isinstance(ref.dtype, str) or ref.dtype not in DTYPES:  # (a list: unhashable)
        raise InvalidReference(f"TensorRef dict field 'dtype' is {short_repr(ref.dtype)}, "
                               f"not a dtype straw stores ({', '.join(DTYPES)})")
    if (ref.source not in ("", *SOURCES) or not isinstance(ref.nbytes, int) or ref.nbytes < 0
            or type(ref.chunk_bytes) is not int or ref.chunk_bytes <= 0
            or any(not isinstance(d, int) or d < 0 for d in ref.shape)
            or len(ref.shape) > MAX_DIMS
            or not isinstance(ref.blob_ordinal, int) or ref.blob_ordinal < 0
            or (ref.kind is not None and not isinstance(ref.kind, str))
            or (ref.pool_id is not None and not isinstance(ref.pool_id, str))):
        raise InvalidReference(f"not a valid TensorRef dict: {short_repr(value)}")


def from_earlier(value: Mapping[str, Any]) -> dict[str, Any]:
    """An earlier straw's ``to_dict`` (``record``, ``name``, ``publication``) in this
    one's field names."""
    try:
        rr = value["record"]
        pub = value.get("publication")
        if pub is None and isinstance(rr, Mapping) and "record_set" in rr:
            pub = rr["record_set"]
        shape = list(value["shape"])
        size = math.prod(shape) * DTYPES[value["dtype"]]
        seg = RecordRef.from_dict(rr).segment
        ordinal = 0
        if pub is not None:
            pub_ref = RecordSetRef.from_dict(pub)
            if pub_ref.manifest.segment == seg:
                ordinal = RecordRef.from_dict(rr).ordinal
        root = value.get("root", "")
        return {"path": os.path.join(root, seg.path) if root else seg.path, "shape": shape,
                "dtype": value["dtype"], "nbytes": size, "kind": value["name"],
                "record_ref": rr, "root": root, "run_id": seg.run_id, "blob_set": pub,
                "blob_ordinal": ordinal, "source": value["source"],
                "chunk_bytes": value["chunk_bytes"]}
    except (KeyError, TypeError, ValueError, InvalidReference):
        raise InvalidReference(f"not a TensorRef dict: {short_repr(value)}") from None
