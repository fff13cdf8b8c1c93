"""Decoding: the sample a ``sample.v1`` publication (``decode_sample``) or its records
(``sample_from_records``) hold.  Never unpickles: it builds only the types the codec
encodes and those the registry holds."""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Mapping, Sequence
from typing import Any

import msgpack
import numpy as np

from ..checks import check_count, short_repr
from ..errors import CorruptData, StrawError, UnsupportedSchema
from ..pool.records import Record
from ..pool.refs import RecordSetRef
from ..tensors.format import DTYPES
from ..tensors.frameworks import _np_dtype
from ..tensors.records import tensor_from_record
from ..tensors.ref import TensorRef
from .layout import (
    _BIGINT,
    _BYTEARRAY,
    _CUSTOM,
    _DATACLASS,
    _IMAGE,
    _MAP,
    _MARKERS,
    _NPSCALAR,
    _TENSOR,
    _TENSORREF,
    _TUPLE,
    _U32,
    CODEC,
    FORMAT,
)
from .registry import Registry, _registry


class _Decoder:
    """msgpack hooks that rebuild a sample.  Every malformed piece is ``CorruptData``
    naming it, every unknown kind ``UnsupportedSchema``: the record passed its checksum,
    so a structure that does not parse was written wrong or crafted."""

    def __init__(self, store: Any, tensors: Mapping[int, Any], lazy_over: int | None,
                 registry: Registry) -> None:
        self.store = store
        self.tensors = tensors
        self.lazy_over = lazy_over
        self.registry = registry
        self.loaded: dict[int, Any] = {}
        # markers must each open an array: those seen (ext_hook) minus those consumed
        # (list_hook) is non-zero when one sits anywhere else
        self.markers_seen = 0
        self.markers_used = 0

    def ext(self, code: int, data: bytes) -> Any:
        if code in _MARKERS:
            if data:
                raise UnsupportedSchema(f"sample marker {code} carries data")
            self.markers_seen += 1
            return _MARKERS[code]
        if code == _TENSOR:
            if len(data) != _U32.size:
                raise CorruptData(f"sample tensor entry holds {len(data)} bytes, not "
                                  f"{_U32.size}")
            (ordinal,) = _U32.unpack(data)
            if ordinal not in self.tensors:
                raise UnsupportedSchema(f"sample names tensor record {ordinal}, which is not a "
                                        "tensor of its publication")
            if ordinal not in self.loaded:
                ref = self.tensors[ordinal]  # a TensorRef, or a tensor decoded already
                if isinstance(ref, TensorRef):
                    lazy = self.lazy_over is not None and ref.nbytes > self.lazy_over
                    # a sample round-trips its tensors' types: NumPy in, NumPy out
                    # (TensorRef.load alone is torch whenever torch is importable)
                    ref = ref if lazy else ref.load(
                        framework="numpy" if ref.source == "numpy" else None)
                self.loaded[ordinal] = ref
            return self.loaded[ordinal]
        if code == _TENSORREF:
            return TensorRef.from_dict(_unpack_ext(data, "tensor reference"), self.store)
        if code == _NPSCALAR:
            return _np_scalar(_unpack_ext(data, "NumPy scalar"))
        if code == _BIGINT:
            try:
                return int(data.decode("ascii"))
            except ValueError:  # UnicodeDecodeError too
                raise CorruptData(f"sample big int {data[:40]!r} is not a decimal "
                                  "integer") from None
        if code == _BYTEARRAY:
            return bytearray(data)
        if code == _IMAGE:
            return _image(data)
        raise UnsupportedSchema(f"sample holds msgpack ext type {code}, unknown to this straw")

    def array(self, items: list[Any]) -> Any:
        if not items or not isinstance(items[0], msgpack.ExtType):
            return items
        code = items[0].code
        if code not in _MARKERS:
            raise UnsupportedSchema(f"sample holds a marker array of kind {code}, unknown here")
        self.markers_used += 1
        if code == _TUPLE:
            return tuple(items[1:])
        if code == _CUSTOM and len(items) == 4:
            return self.custom(items[1], items[2], items[3])
        if code == _MAP and len(items) % 2 == 1:
            try:
                return dict(zip(items[1::2], items[2::2], strict=True))
            except TypeError:  # an unhashable key
                raise CorruptData("sample holds a map marker with an unhashable key") from None
        if code == _DATACLASS and len(items) == 3:
            return _dataclass(self.registry, items[1], items[2])
        raise CorruptData(f"sample holds a marker array of kind {code} with {len(items)} "
                          "items, which is not how that kind is laid out")

    def custom(self, tag: Any, version: Any, value: Any) -> Any:
        if not isinstance(tag, str) or isinstance(version, bool) or not isinstance(version, int):
            raise CorruptData(f"sample holds a registered-type entry with tag {short_repr(tag)} "
                              f"and version {short_repr(version)}; expected a str and an int")
        decode = self.registry.decoder(tag, version)
        try:
            return decode(value)
        except StrawError:
            raise
        except Exception as e:  # the user's decoder refused the stored value
            raise CorruptData(f"the decoder registered for type tag {tag!r} version {version} "
                              f"failed on its stored value: {e!r}") from e


def _unpack_ext(data: bytes, what: str) -> Any:
    try:
        return msgpack.unpackb(data, raw=False)
    except Exception as e:  # msgpack raises several types for malformed input
        raise CorruptData(f"sample {what} entry does not decode: {e}") from None


def _np_scalar(value: Any) -> Any:
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[1], bytes)):
        raise CorruptData(f"sample NumPy scalar entry {short_repr(value)} is not [dtype, bytes]")
    name, raw = value
    if not isinstance(name, str) or name not in DTYPES:
        raise UnsupportedSchema(f"sample holds a NumPy scalar of dtype {short_repr(name)}")
    if len(raw) != DTYPES[name]:
        raise CorruptData(f"sample NumPy {name} scalar holds {len(raw)} bytes, not "
                          f"{DTYPES[name]}")
    return np.frombuffer(raw, dtype=_np_dtype(name).newbyteorder("<"))[0]


def _image(data: bytes) -> Any:
    try:
        from PIL import Image
    except ImportError:
        raise UnsupportedSchema("sample holds a PNG image; install Pillow to decode "
                                "it") from None
    try:
        img = Image.open(io.BytesIO(data), formats=["PNG"])
        img.load()
    except Exception as e:  # PIL raises OSError, ValueError, DecompressionBombError...
        raise CorruptData(f"sample PNG image does not decode: {e}") from None
    return img


def _dataclass(registry: Registry, name: Any, fields: Any) -> Any:
    if not isinstance(name, str) or not isinstance(fields, dict) \
            or not all(isinstance(k, str) for k in fields):
        raise CorruptData(f"malformed dataclass entry {short_repr(name)}")
    cls = registry.dataclass(name)  # only registered classes, never a lookup by name
    names = [f.name for f in dataclasses.fields(cls)]
    if set(names) != set(fields):
        raise UnsupportedSchema(f"dataclass {name} now has fields {names}, the sample "
                                f"{sorted(fields)}; register a versioned type for it")
    klass: Any = cls
    inst = klass.__new__(klass)  # restored without calling __init__
    for k, v in fields.items():
        object.__setattr__(inst, k, v)
    return inst


def decode_sample(store: Any, ref: RecordSetRef, *, lazy_tensors_over: int | None = None,
                  registry: Registry | None = None) -> Any:
    """The sample published at ``ref``, checked (D6).  Tensors larger than
    ``lazy_tensors_over`` bytes stay lazy ``TensorRef``s."""
    if lazy_tensors_over is not None:
        check_count("lazy_tensors_over", lazy_tensors_over)
    registry = _registry(registry)
    manifest = store.checked_manifest(ref)
    if not manifest.records or manifest.records[0].codec != CODEC:
        raise UnsupportedSchema(f"{ref!r} is not a {CODEC} publication (record 0 is "
                                f"{manifest.records[0].codec if manifest.records else 'none'})")
    fmt = manifest.records[0].metadata.get("format")
    if fmt != FORMAT:
        raise UnsupportedSchema(f"{ref!r}: sample format {fmt!r}; this straw reads {FORMAT}")
    body = store.read_record(manifest.record_refs[0]).payload
    dec = _Decoder(store, TensorRef.from_record_set_many(store, ref), lazy_tensors_over,
                   registry)
    return _unpack(body, dec, repr(ref))


def _unpack(body: Any, dec: _Decoder, where: str) -> Any:
    try:
        sample = msgpack.unpackb(body, raw=False, strict_map_key=False, ext_hook=dec.ext,
                                 list_hook=dec.array, use_list=True)
    except StrawError as e:
        raise type(e)(f"{where}: {e}") from None
    except Exception as e:  # msgpack raises several types for malformed input
        raise CorruptData(f"{where}: the sample record does not decode as {CODEC}: "
                          f"{e}") from None
    if dec.markers_seen != dec.markers_used:
        raise CorruptData(f"{where}: the sample record holds a marker outside the first item "
                          "of an array")
    return sample


def sample_from_records(records: Sequence[Record], *,
                        tensors: Mapping[int, TensorRef] | None = None,
                        lazy_tensors_over: int | None = None, store: Any = None,
                        registry: Registry | None = None) -> Any:
    """The sample ``records`` hold (as ``sample_records`` made them, or as ``store.read``
    returns them), without a store: its tensors decoded from its ``tensor.v1`` records
    (chunk checksums verified), or, when ``tensors`` is given (ordinal -> ``TensorRef``,
    e.g. ``TensorRef.from_record_set_many(store, ref)``), taken from there, those larger
    than ``lazy_tensors_over`` bytes left lazy.  ``store`` binds the ``TensorRef``s the
    sample names (unbound ones open their pool when loaded)."""
    if lazy_tensors_over is not None:
        check_count("lazy_tensors_over", lazy_tensors_over)
    registry = _registry(registry)
    records = list(records)
    if not records or records[0].codec != CODEC:
        raise UnsupportedSchema(f"records are not a {CODEC} sample (record 0 is "
                                f"{records[0].codec if records else 'none'})")
    fmt = records[0].metadata.get("format")
    if fmt != FORMAT:
        raise UnsupportedSchema(f"sample format {fmt!r}; this straw reads {FORMAT}")
    tensors_: dict[int, Any]
    if tensors is None:
        tensors_ = {i: tensor_from_record(r, where=f"records[{i}]")
                    for i, r in enumerate(records) if i}
    else:
        tensors_ = dict(tensors)
    dec = _Decoder(store, tensors_, lazy_tensors_over, registry)
    return _unpack(records[0].payload, dec, f"sample record {records[0].record_id!r}")
