"""The sample codec: nested Python samples as one publication of msgpack + tensor records.

API::

    ref = encode_sample(store, sample, *, submission_id, dependencies=(), registry=None)
    sample = decode_sample(store, ref, *, lazy_tensors_over=None, registry=None)
    register_type(cls, tag, version, encode, decode)      # the default registry
    Registry().register(cls, tag, version, encode, decode)  # a private one

One publication holds record 0, ``sample`` (codec ``sample.v1``: the structure as
msgpack), and one ``tensor.v1`` record per distinct tensor (``straw.tensor``: chunk
checksums, zero-copy writes).  What is encoded:

* None, bool, int (any size), float (NaN and infinities too), str, bytes, bytearray;
* list, tuple, dict with keys of any encodable hashable type (str, int, float, bytes,
  tuple, frozen dataclasses, registered types...); exact types only (``OrderedDict``,
  namedtuples and other subclasses need a registration);
* NumPy arrays and torch tensors (the ten ``straw.tensor`` dtypes): tensor records, one per
  distinct object (a tensor referenced twice is stored once and decodes to one object);
  NumPy scalars inline; ``TensorRef``s as references to their publication, which becomes
  a dependency of the sample's publication (no bytes copied);
* PIL images, as PNG (when Pillow is importable);
* dataclasses, field by field, restored without calling ``__init__`` (the class must be
  importable, i.e. its module already imported, and have the same fields);
* registered types: ``register_type(cls, tag, version, encode, decode)``; ``encode(obj)``
  returns any encodable value, ``decode(value)`` rebuilds the object.  Encoding uses the
  highest version registered for ``cls``; every registered version stays decodable.

Rejections: an unsupported type raises ``TypeError`` naming the field path
(``sample['obs'][3].foo``); a cycle raises ``ValueError``; nesting deeper than
``MAX_DEPTH`` containers raises ``ValueError``.  On decode, an unknown tag or version, or
a structure this version does not know, raises ``UnsupportedSchema``.  Never pickle: the
decoder only builds the types listed above.

``lazy_tensors_over=N`` leaves tensors larger than N bytes as lazy ``TensorRef``s (load
them, or read rows, later); the others load eagerly (torch when published from torch and
torch is importable, else NumPy; see ``straw.tensor``).

msgpack layout: plain values, arrays and maps as such; a marker array
``[ExtType(code, b""), ...]`` for tuples, dataclasses and registered types (users cannot
put ``ExtType`` values in samples, so markers are unambiguous); ext types for tensors,
NumPy scalars, big ints, bytearrays and images.
"""

from __future__ import annotations

import dataclasses
import io
import struct
import sys
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
import numpy as np

from .errors import UnsupportedSchema
from .refs import Record, RecordSetRef
from .tensor import DTYPES, TensorRef, _is_torch_tensor, _np_dtype, tensor_record

CODEC = "sample.v1"
FORMAT = 1
MAX_DEPTH = 200

# marker arrays
_TUPLE, _DATACLASS, _CUSTOM, _MAP = 1, 2, 3, 4
# leaf ext types
_TENSOR, _TENSORREF, _NPSCALAR, _BIGINT, _BYTEARRAY, _IMAGE = 16, 17, 18, 19, 20, 21
_MARKERS = {c: msgpack.ExtType(c, b"") for c in (_TUPLE, _DATACLASS, _CUSTOM, _MAP)}
_U32 = struct.Struct("<I")


class Registry:
    """Custom types by class (for encoding) and by (tag, version) (for decoding)."""

    def __init__(self) -> None:
        self._by_cls: dict[type, tuple[str, int, Callable[[Any], Any]]] = {}
        self._by_tag: dict[tuple[str, int], Callable[[Any], Any]] = {}

    def register(self, cls: type, tag: str, version: int, encode: Callable[[Any], Any],
                 decode: Callable[[Any], Any]) -> None:
        """Register ``cls`` under ``tag`` at ``version`` (int >= 1)."""
        if not isinstance(cls, type):
            raise TypeError(f"cls must be a class, got {cls!r}")
        if not isinstance(tag, str) or not tag:
            raise TypeError(f"tag must be a non-empty str, got {tag!r}")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise ValueError(f"version must be an int >= 1, got {version!r}")
        if not callable(encode) or not callable(decode):
            raise TypeError("encode and decode must be callables")
        if (tag, version) in self._by_tag:
            raise ValueError(f"tag {tag!r} version {version} is already registered")
        known = self._by_cls.get(cls)
        if known is not None and known[0] != tag:
            raise ValueError(f"{cls.__qualname__} is already registered as tag {known[0]!r}")
        self._by_tag[(tag, version)] = decode
        if known is None or version > known[1]:
            self._by_cls[cls] = (tag, version, encode)

    def encoder(self, cls: type) -> tuple[str, int, Callable[[Any], Any]] | None:
        for base in cls.__mro__:
            found = self._by_cls.get(base)
            if found is not None:
                return found
        return None

    def decoder(self, tag: str, version: int) -> Callable[[Any], Any]:
        dec = self._by_tag.get((tag, version))
        if dec is None:
            known = sorted(v for t, v in self._by_tag if t == tag)
            raise UnsupportedSchema(
                f"sample holds type tag {tag!r} version {version}, which is not registered "
                f"here (registered versions of that tag: {known or 'none'}); register it "
                "with straw.codec.register_type")
        return dec


DEFAULT_REGISTRY = Registry()


def register_type(cls: type, tag: str, version: int, encode: Callable[[Any], Any],
                  decode: Callable[[Any], Any]) -> None:
    """Register a custom type in the default registry (see ``Registry.register``)."""
    DEFAULT_REGISTRY.register(cls, tag, version, encode, decode)


# --- encoding ---------------------------------------------------------------------------


def _key_path(path: str, key: Any) -> str:
    return f"{path}[{key!r}]"


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
            tag, version, encode = custom
            self.enter(x, path, depth)
            try:
                value = self.enc(encode(x), f"{path}<{tag}>", depth + 1, key)
            finally:
                del self.active[id(x)]
            return (_MARKERS[_CUSTOM], tag, version, value)
        if t in (list, tuple, dict):
            self.enter(x, path, depth)
            try:
                if t is dict:
                    return self.mapping([(self.enc(k, f"{path}.keys()", depth + 1, True),
                                          self.enc(v, _key_path(path, k), depth + 1, key))
                                         for k, v in x.items()], key)
                items = tuple(self.enc(v, f"{path}[{i}]", depth + 1, key)
                              for i, v in enumerate(x))
            finally:
                del self.active[id(x)]
            return (_MARKERS[_TUPLE], *items) if t is tuple else items
        if t is bytearray:
            return msgpack.ExtType(_BYTEARRAY, bytes(x))
        if isinstance(x, np.generic) and not isinstance(x, np.ndarray):
            name = x.dtype.name
            if name not in DTYPES:
                raise TypeError(f"{path} is a NumPy {name} scalar; supported dtypes: "
                                f"{', '.join(DTYPES)}")
            return msgpack.ExtType(_NPSCALAR, msgpack.packb(
                [name, np.asarray(x).astype(x.dtype.newbyteorder("<")).tobytes()]))
        if isinstance(x, np.ndarray) or _is_torch_tensor(x):
            return msgpack.ExtType(_TENSOR, _U32.pack(self.tensor(x, path)))
        if isinstance(x, TensorRef):
            if x.publication not in self.deps:
                self.deps.append(x.publication)
            return msgpack.ExtType(_TENSORREF, msgpack.packb(x.to_dict()))
        image = _pil_image_class()
        if image is not None and isinstance(x, image):
            return msgpack.ExtType(_IMAGE, _png(x, path))
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            self.enter(x, path, depth)
            try:
                fields = self.mapping(
                    [(f.name, self.enc(getattr(x, f.name), f"{path}.{f.name}", depth + 1, key))
                     for f in dataclasses.fields(x)], key)
            finally:
                del self.active[id(x)]
            return (_MARKERS[_DATACLASS], f"{t.__module__}:{t.__qualname__}", fields)
        raise TypeError(
            f"{path} is a {t.__module__}.{t.__qualname__}, which the sample codec cannot "
            "encode; convert it, or register it with straw.codec.register_type(cls, tag, "
            "version, encode, decode)")

    @staticmethod
    def mapping(pairs: list[tuple[Any, Any]], key: bool) -> Any:
        if key:
            return (_MARKERS[_MAP], *(e for kv in pairs for e in kv))
        return dict(pairs)

    def tensor(self, x: Any, path: str) -> int:
        ordinal = self.tensor_ids.get(id(x))
        if ordinal is None:
            ordinal = len(self.tensors) + 1  # record 0 is the sample
            self.tensors.append(tensor_record(f"t{ordinal}", x, where=path))
            self.tensor_ids[id(x)] = ordinal
            self.keep.append(x)
        return ordinal


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


def encode_sample(store: Any, sample: Any, *, submission_id: str,
                  dependencies: Sequence[RecordSetRef] = (),
                  registry: Registry | None = None) -> RecordSetRef:
    """Publish ``sample`` as one publication (see the module docstring); returns its
    reference.  Idempotent per ``submission_id`` (D7)."""
    enc = _Encoder(registry or DEFAULT_REGISTRY)
    body = msgpack.packb(enc.enc(sample, "sample", 0), use_bin_type=True)
    meta = {"format": FORMAT, "tensors": len(enc.tensors)}
    deps = list(dependencies) + [d for d in enc.deps if d not in dependencies]
    return store.publish([Record("sample", body, CODEC, meta), *enc.tensors],
                         submission_id=submission_id, dependencies=deps)


# --- decoding ---------------------------------------------------------------------------


class _Decoder:
    def __init__(self, store: Any, tensors: dict[int, TensorRef], lazy_over: int | None,
                 registry: Registry) -> None:
        self.store = store
        self.tensors = tensors
        self.lazy_over = lazy_over
        self.registry = registry
        self.loaded: dict[int, Any] = {}

    def ext(self, code: int, data: bytes) -> Any:
        if code in _MARKERS:
            if data:
                raise UnsupportedSchema(f"sample marker {code} carries data")
            return _MARKERS[code]
        if code == _TENSOR:
            (ordinal,) = _U32.unpack(data)
            if ordinal not in self.tensors:
                raise UnsupportedSchema(f"sample names tensor record {ordinal}, which is not a "
                                        "tensor of its publication")
            if ordinal not in self.loaded:
                ref = self.tensors[ordinal]
                lazy = self.lazy_over is not None and ref.nbytes > self.lazy_over
                self.loaded[ordinal] = ref if lazy else ref.load()
            return self.loaded[ordinal]
        if code == _TENSORREF:
            return TensorRef.from_dict(msgpack.unpackb(data, raw=False), self.store)
        if code == _NPSCALAR:
            name, raw = msgpack.unpackb(data, raw=False)
            if name not in DTYPES:
                raise UnsupportedSchema(f"sample holds a NumPy scalar of dtype {name!r}")
            return np.frombuffer(raw, dtype=_np_dtype(name).newbyteorder("<"))[0]
        if code == _BIGINT:
            return int(data.decode())
        if code == _BYTEARRAY:
            return bytearray(data)
        if code == _IMAGE:
            try:
                from PIL import Image
            except ImportError:
                raise UnsupportedSchema("sample holds a PNG image; install Pillow to decode "
                                        "it") from None
            img = Image.open(io.BytesIO(data))
            img.load()
            return img
        raise UnsupportedSchema(f"sample holds msgpack ext type {code}, unknown to this straw")

    def array(self, items: list[Any]) -> Any:
        if not items or not isinstance(items[0], msgpack.ExtType):
            return items
        code = items[0].code
        if code == _TUPLE:
            return tuple(items[1:])
        if code == _CUSTOM and len(items) == 4:
            _, tag, version, value = items
            return self.registry.decoder(tag, version)(value)
        if code == _MAP and len(items) % 2 == 1:
            return dict(zip(items[1::2], items[2::2], strict=True))
        if code == _DATACLASS and len(items) == 3:
            return _dataclass(items[1], items[2])
        raise UnsupportedSchema(f"sample holds a marker array of kind {code}, unknown here")


def _dataclass(name: Any, fields: Any) -> Any:
    if not isinstance(name, str) or ":" not in name or not isinstance(fields, dict):
        raise UnsupportedSchema(f"malformed dataclass entry {name!r}")
    module, qualname = name.split(":", 1)
    obj: Any = sys.modules.get(module)  # never import: only classes already loaded
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if not (isinstance(obj, type) and dataclasses.is_dataclass(obj)):
        raise UnsupportedSchema(f"sample holds dataclass {name}, which is not loaded here; "
                                f"import {module} first")
    names = [f.name for f in dataclasses.fields(obj)]
    if sorted(names) != sorted(fields):
        raise UnsupportedSchema(f"dataclass {name} now has fields {names}, the sample "
                                f"{sorted(fields)}; register a versioned type for it")
    inst = obj.__new__(obj)
    for k, v in fields.items():
        object.__setattr__(inst, k, v)
    return inst


def decode_sample(store: Any, ref: RecordSetRef, *, lazy_tensors_over: int | None = None,
                  registry: Registry | None = None) -> Any:
    """The sample published at ``ref``, checked (D6).  Tensors larger than
    ``lazy_tensors_over`` bytes stay lazy ``TensorRef``s."""
    manifest = store.manifest(ref)
    if not manifest.records or manifest.records[0].codec != CODEC:
        raise UnsupportedSchema(f"{ref!r} is not a {CODEC} publication (record 0 is "
                                f"{manifest.records[0].codec if manifest.records else 'none'})")
    fmt = manifest.records[0].metadata.get("format")
    if fmt != FORMAT:
        raise UnsupportedSchema(f"{ref!r}: sample format {fmt!r}; this straw reads {FORMAT}")
    body = store.read_record(manifest.record_refs[0]).payload
    dec = _Decoder(store, TensorRef.from_record_set_many(store, ref), lazy_tensors_over,
                   registry or DEFAULT_REGISTRY)
    try:
        return msgpack.unpackb(body, raw=False, strict_map_key=False, ext_hook=dec.ext,
                               list_hook=dec.array, use_list=True)
    except (UnsupportedSchema, ValueError, TypeError) as e:
        if isinstance(e, UnsupportedSchema):
            raise
        raise UnsupportedSchema(f"{ref!r}: the sample does not decode: {e}") from None


__all__ = ["CODEC", "MAX_DEPTH", "Registry", "DEFAULT_REGISTRY", "register_type",
           "encode_sample", "decode_sample"]
