"""The registry of the sample codec: custom types by class (for encoding) and by (tag,
version) (for decoding), and dataclasses by class and by name; the default registry and
the calls that register into it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..errors import UnsupportedSchema
from ..pool.refs import RecordSetRef


class Registry:
    """Custom types by class (for encoding) and by (tag, version) (for decoding), and
    dataclasses by class and by name: the only classes the decoder builds."""

    def __init__(self) -> None:
        self._by_cls: dict[type, tuple[str, int, Callable[[Any], Any]]] = {}
        self._by_tag: dict[tuple[str, int], Callable[[Any], Any]] = {}
        self._dataclass_names: dict[type, str] = {}
        self._dataclasses: dict[str, type] = {}
        # cls -> its encoder (or None) as found along its MRO: a sample asks this for
        # every container it holds; emptied by every registration
        self._encoder_memo: dict[type, tuple[str, int, Callable[[Any], Any]] | None] = {}
        # built in: references decode through their checking constructor.  Version 1 is
        # the flat dict form (still decoded: ``from_dict`` reads both forms), version 2
        # straw-queue's shape (``manifest`` RecordRef, usage counts).
        self.register(RecordSetRef, "straw.RecordSetRef", 1, RecordSetRef.to_dict,
                      RecordSetRef.from_dict)
        self.register(RecordSetRef, "straw.RecordSetRef", 2, RecordSetRef.to_dict,
                      RecordSetRef.from_dict)

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
        self._encoder_memo.clear()

    def register_dataclass(self, cls: type, name: str | None = None) -> None:
        """Make dataclass ``cls`` encodable field by field under ``name`` (default
        ``"module:qualname"``; give the old name when a class moves).  Registering the
        same class under the same name again is a no-op."""
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise TypeError(f"cls must be a dataclass class, got {cls!r}")
        name = f"{cls.__module__}:{cls.__qualname__}" if name is None else name
        if not isinstance(name, str) or not name:
            raise TypeError(f"name must be a non-empty str, got {name!r}")
        known = self._dataclasses.get(name)
        if known is not None and known is not cls:
            raise ValueError(f"dataclass name {name!r} is already registered for "
                             f"{known.__module__}.{known.__qualname__}")
        named = self._dataclass_names.get(cls)
        if named is not None and named != name:
            raise ValueError(f"{cls.__qualname__} is already registered as dataclass {named!r}")
        self._dataclasses[name] = cls
        self._dataclass_names[cls] = name

    def dataclass_name(self, cls: type) -> str | None:
        """The name ``cls`` is encoded under, or None if it is not registered (exact
        class: a subclass needs its own registration, it may have other fields)."""
        return self._dataclass_names.get(cls)

    def dataclass(self, name: str) -> type:
        cls = self._dataclasses.get(name)
        if cls is None:
            raise UnsupportedSchema(
                f"sample holds dataclass {name!r}, which is not registered here; register "
                "it with straw.codec.register_dataclass(cls) (the sample codec only builds "
                "registered types)")
        return cls

    def encoder(self, cls: type) -> tuple[str, int, Callable[[Any], Any]] | None:
        try:
            return self._encoder_memo[cls]
        except KeyError:
            pass
        found = next((self._by_cls[b] for b in cls.__mro__ if b in self._by_cls), None)
        self._encoder_memo[cls] = found
        return found

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


def register_dataclass(cls: type, name: str | None = None) -> None:
    """Register a dataclass in the default registry (see ``Registry.register_dataclass``)."""
    DEFAULT_REGISTRY.register_dataclass(cls, name)


def _registry(registry: object) -> Registry:
    """The registry a call uses: the default one, or the caller's (checked)."""
    if registry is None:
        return DEFAULT_REGISTRY
    if not isinstance(registry, Registry):
        raise TypeError(f"registry must be a straw.codec.Registry, got "
                        f"{type(registry).__name__}")
    return registry
