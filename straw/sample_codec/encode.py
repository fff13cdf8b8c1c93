"""Encoding: a sample as the records of one publication (``sample_records``) and its
publication (``encode_sample``).  ``_Encoder`` walks the sample; a sample of plain values
in lists and dicts is packed by msgpack at once (``_plain_body``), to the same bytes."""

from __future__ import annotations

import dataclasses
import io
import sys
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
import numpy as np

from ..pool.records import Record
from ..pool.refs import RecordSetRef
from ..tensors.format import DTYPES
from ..tensors.frameworks import _is_torch_tensor
from ..tensors.records import tensor_record
from ..tensors.ref import TensorRef
from .layout import (
    _BIGINT,
    _BYTEARRAY,
    _CUSTOM_MARKER,
    _DATACLASS_MARKER,
    _IMAGE,
    _MAP_MARKER,
    _NPSCALAR,
    _TENSOR,
    _TENSORREF,
    _TUPLE_MARKER,
    _U32,
    CODEC,
    FORMAT,
    MAX_DEPTH,
)
from .registry import Registry, _registry


def _key_path(path: str, key: Any) -> str:
    return f"{path}[{key!r}]"


# values ``_Encoder.enc`` returns as they are (and ints in msgpack's range): a container
# passes such children through without the call (and the child's path string) per value
# (the sample encoder's cost is per value: plain structures skip most of it)
_PLAIN = frozenset({type(None), bool, str, bytes, float})
_INT_MIN, _INT_END = -(1 << 63), 1 << 64


class _Encoder:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.tensors: list[Record] = []
        self.tensor_ids: dict[int, int] = {}  # id(tensor) -> ordinal
        self.keep: list[Any] = []  # keeps deduplicated objects alive (stable ids)
        self.deps: list[RecordSetRef] = []
        self.active: dict[int, str] = {}  # containers on the current path

    def enter(self, obj: Any, path: str, depth: int) -> None:
        if depth >= MAX_DEPTH:
            raise ValueError(f"{path}: the sample nests deeper than {MAX_DEPTH} containers")
        prev = self.active.get(id(obj))
        if prev is not None:
            raise ValueError(f"{path} refers back to {prev}: samples must not contain cycles")
        self.active[id(obj)] = path

    def enc(self, x: Any, path: str, depth: int, key: bool = False) -> Any:
        """The msgpack-ready form of ``x``; inside a dict key (``key``) everything is
        hashable: arrays are tuples and maps become ``_MAP`` marker arrays."""
        t = type(x)
        if x is None or t in (bool, str, bytes, float):
            return x
        if t is int:
            if -(1 << 63) <= x < (1 << 64):
                return x
            return msgpack.ExtType(_BIGINT, str(x).encode())
        custom = self.registry.encoder(t)
        if custom is not None:
            return self.custom(x, custom, path, depth, key)
        if t in (list, tuple, dict):
            if not x and depth < MAX_DEPTH:  # empty: nothing to walk, no cycle possible
                return self.mapping([], key) if t is dict else \
                    ((_TUPLE_MARKER,) if t is tuple else ())
            self.enter(x, path, depth)
            plain, lo, end = _PLAIN, _INT_MIN, _INT_END
            try:
                if t is dict:
                    return self.mapping([
                        (k if type(k) in plain or (type(k) is int and lo <= k < end)
                         else self.enc(k, f"{path}.keys()", depth + 1, True),
                         v if type(v) in plain or (type(v) is int and lo <= v < end)
                         else self.enc(v, _key_path(path, k), depth + 1, key))
                        for k, v in x.items()], key)
                items = tuple(v if type(v) in plain or (type(v) is int and lo <= v < end)
                              else self.enc(v, f"{path}[{i}]", depth + 1, key)
                              for i, v in enumerate(x))
            finally:
                del self.active[id(x)]
            return (_TUPLE_MARKER, *items) if t is tuple else items
        return self.leaf(x, t, path, depth, key)

    def leaf(self, x: Any, t: type, path: str, depth: int, key: bool) -> Any:
        """The msgpack-ready form of a value that is neither plain, nor an int, nor of a
        registered type, nor a list, tuple or dict."""
        if t is bytearray:
            return msgpack.ExtType(_BYTEARRAY, bytes(x))
        if isinstance(x, np.generic) and not isinstance(x, np.ndarray):
            return _np_scalar_ext(x, path)
        if isinstance(x, np.ndarray) or _is_torch_tensor(x):
            return msgpack.ExtType(_TENSOR, _U32.pack(self.tensor(x, path)))
        if isinstance(x, TensorRef):
            return self.tensor_ref(x)
        image = _pil_image_class()
        if image is not None and isinstance(x, image):
            return msgpack.ExtType(_IMAGE, _png(x, path))
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            return self.dataclass(x, t, path, depth, key)
        raise TypeError(
            f"{path} is a {t.__module__}.{t.__qualname__}, which the sample codec cannot "
            "encode; convert it, or register it with straw.codec.register_type(cls, tag, "
            "version, encode, decode)")

    def custom(self, x: Any, custom: tuple[str, int, Callable[[Any], Any]], path: str,
               depth: int, key: bool) -> Any:
        """A value of a registered type: a ``_CUSTOM`` marker array of its tag, version and
        encoded value."""
        tag, version, encode = custom
        self.enter(x, path, depth)
        try:
            value = self.enc(encode(x), f"{path}<{tag}>", depth + 1, key)
        finally:
            del self.active[id(x)]
        return (_CUSTOM_MARKER, tag, version, value)

    def tensor_ref(self, x: TensorRef) -> Any:
        """A reference to a published tensor; its publication becomes a dependency."""
        pub = x._publication()
        if pub not in self.deps:
            self.deps.append(pub)
        return msgpack.ExtType(_TENSORREF, msgpack.packb(x.to_dict()))

    def dataclass(self, x: Any, t: type, path: str, depth: int, key: bool) -> Any:
        """A registered dataclass, field by field (``TypeError`` for an unregistered one)."""
        name = self.registry.dataclass_name(t)
        if name is None:
            raise TypeError(
                f"{path} is a {t.__module__}.{t.__qualname__} dataclass, which is not "
                "registered with the sample codec; call straw.codec.register_dataclass("
                f"{t.__qualname__}) in the writer and in every reader (the decoder only "
                "builds registered types)")
        self.enter(x, path, depth)
        try:
            fields = self.mapping(
                [(f.name, self.enc(getattr(x, f.name), f"{path}.{f.name}", depth + 1, key))
                 for f in dataclasses.fields(x)], key)
        finally:
            del self.active[id(x)]
        return (_DATACLASS_MARKER, name, fields)

    @staticmethod
    def mapping(pairs: list[tuple[Any, Any]], key: bool) -> Any:
        if key:
            return (_MAP_MARKER, *(e for kv in pairs for e in kv))
        return dict(pairs)

    def tensor(self, x: Any, path: str) -> int:
        ordinal = self.tensor_ids.get(id(x))
        if ordinal is None:
            ordinal = len(self.tensors) + 1  # record 0 is the sample
            self.tensors.append(tensor_record(x, f"t{ordinal}", where=path))
            self.tensor_ids[id(x)] = ordinal
            self.keep.append(x)
        return ordinal


def _np_scalar_ext(x: Any, path: str) -> msgpack.ExtType:
    """A NumPy scalar: its dtype name and little-endian bytes."""
    name = x.dtype.name
    if name not in DTYPES:
        raise TypeError(f"{path} is a NumPy {name} scalar; supported dtypes: "
                        f"{', '.join(DTYPES)}")
    return msgpack.ExtType(_NPSCALAR, msgpack.packb(
        [name, np.asarray(x).astype(x.dtype.newbyteorder("<")).tobytes()]))


def _pil_image_class() -> Any:
    mod = sys.modules.get("PIL.Image")  # a PIL image implies PIL is imported
    return None if mod is None else mod.Image


def _png(img: Any, path: str) -> bytes:
    out = io.BytesIO()
    try:
        img.save(out, format="PNG")
    except (OSError, ValueError, KeyError) as e:
        raise TypeError(f"{path} is a PIL image of mode {img.mode!r}, which PNG cannot "
                        f"store ({e}); convert it (e.g. img.convert('RGB'))") from None
    return out.getvalue()


def sample_records(sample: Any, *, registry: Registry | None = None,
                   tokens: int | None = None) -> tuple[list[Record], list[RecordSetRef]]:
    """The records of ``sample``, without publishing them: record 0 the structure (with
    ``tokens`` as its token count), then one ``tensor.v1`` record per distinct tensor;
    and the publications its ``TensorRef``s name, which a publication of these records
    must depend on.  (``encode_sample`` publishes exactly these.)"""
    reg = _registry(registry)
    body = _plain_body(sample, reg)
    if body is not None:  # msgpack-ready as it is: no tensors, no dependencies
        return [Record("sample", body, CODEC, {"format": FORMAT, "tensors": 0}, tokens)], []
    enc = _Encoder(reg)
    body = msgpack.packb(enc.enc(sample, "sample", 0), use_bin_type=True)
    meta = {"format": FORMAT, "tensors": len(enc.tensors)}
    return [Record("sample", body, CODEC, meta, tokens), *enc.tensors], list(enc.deps)


# the values msgpack packs exactly as ``_Encoder.enc`` returns them (ints only within
# msgpack's range: it hands the others to ``default``, which sends them to the walk)
_AS_IS = frozenset({type(None), bool, int, float, str, bytes})
_AS_IS_OR_NESTED = _AS_IS | {list, dict}


class _NotPlain(Exception):
    """A value the fast path leaves to ``_Encoder`` (raised by msgpack's ``default``)."""


def _not_plain(value: Any) -> Any:
    raise _NotPlain


def _is_plain(x: Any, depth: int) -> bool:
    """``x`` (a list or dict) holds only what ``_AS_IS`` lists, in lists and dicts, with
    no container at ``MAX_DEPTH`` or deeper (so no cycle: a cycle is infinitely deep).
    Type checks run over ``map(type, ...)``: C loops, no call per value."""
    if depth >= MAX_DEPTH:
        return False
    if type(x) is dict:
        if not _AS_IS.issuperset(map(type, x)):  # keys (a tuple key is a marker array)
            return False
        values: Any = x.values()
    else:
        values = x
    kinds = set(map(type, values))
    if kinds <= _AS_IS:
        return True
    if not kinds <= _AS_IS_OR_NESTED:
        return False
    for v in values:
        t = type(v)
        if t is list:  # a list of plain values (token buffer pair, version span) inline
            if depth + 1 >= MAX_DEPTH or not (_AS_IS.issuperset(map(type, v))
                                              or _is_plain(v, depth + 1)):
                return False
        elif t is dict and not _is_plain(v, depth + 1):
            return False
    return True


def _plain_body(sample: Any, reg: Registry) -> bytes | None:
    """Record 0's bytes for a sample of plain values in lists and dicts (a rollout group,
    most JSON-like samples), packed by msgpack at once: the same bytes ``_Encoder``'s walk
    gives (it returns such values as they are), without its call per container and
    value.  None: the walk is needed (tuples, tensors, custom types, big ints, bytearray,
    depth, cycles; or a registry that encodes list or dict itself)."""
    if type(sample) not in (list, dict) or reg.encoder(list) is not None \
            or reg.encoder(dict) is not None or not _is_plain(sample, 0):
        return None
    try:
        # strict_types: a tuple or a subclass goes to ``default`` (not packed as its base)
        return msgpack.packb(sample, use_bin_type=True, strict_types=True, default=_not_plain)
    except (_NotPlain, OverflowError):
        return None


def encode_sample(store: Any, sample: Any, *, submission_id: str,
                  dependencies: Sequence[RecordSetRef] = (),
                  registry: Registry | None = None) -> RecordSetRef:
    """Publish ``sample`` as one publication (see the module docstring); returns its
    reference.  Idempotent per ``submission_id`` (D7)."""
    records, found = sample_records(sample, registry=registry)
    deps = list(dependencies) + [d for d in found if d not in dependencies]
    return store.publish(records, submission_id=submission_id, dependencies=deps)
