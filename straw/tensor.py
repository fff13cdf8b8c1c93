"""Tensors in packed publications: the module path straw-queue's callers import.

The code lives in ``straw.tensors`` (see its package docstring: the ``tensor.v1`` format,
publishing, ``TensorRef``, checked loads); this module re-exports its public names.
Setting ``straw.tensor.CHUNK_BYTES``, as straw-queue's callers do to change the checksum
granularity of the records made after, reaches ``straw.tensors.records``, which reads it
at each call.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from .tensors import records
from .tensors.buffers import set_load_buffer_cache as set_load_buffer_cache
from .tensors.format import CHUNK_BYTES as CHUNK_BYTES
from .tensors.format import CODEC as CODEC
from .tensors.format import DTYPES as DTYPES
from .tensors.format import MAX_DIMS as MAX_DIMS
from .tensors.format import SOURCES as SOURCES
from .tensors.format import checksum_list as checksum_list
from .tensors.loads import _READ_BYTES as _READ_BYTES
from .tensors.loads import _helpers as _helpers
from .tensors.publish import publish_tensors as publish_tensors
from .tensors.publish import release_tensor_publications as release_tensor_publications
from .tensors.records import MAX_PUBLICATION_BYTES as MAX_PUBLICATION_BYTES
from .tensors.records import MAX_TENSOR_BYTES as MAX_TENSOR_BYTES
from .tensors.records import chunk_checksums as chunk_checksums
from .tensors.records import tensor_from_record as tensor_from_record
from .tensors.records import tensor_record as tensor_record
from .tensors.ref import TensorRef as TensorRef
from .tensors.ref import _unpickle as _unpickle  # (pickled references name it here)


class _Module(types.ModuleType):
    """This module, whose ``CHUNK_BYTES`` straw-queue's callers set: the setting reaches
    ``straw.tensors.records``."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "CHUNK_BYTES":
            setattr(records, name, value)
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Module

__all__ = ["CHUNK_BYTES", "CODEC", "DTYPES", "MAX_DIMS", "MAX_PUBLICATION_BYTES",
           "MAX_TENSOR_BYTES", "SOURCES", "TensorRef", "checksum_list", "chunk_checksums",
           "publish_tensors", "release_tensor_publications", "set_load_buffer_cache",
           "tensor_from_record", "tensor_record"]
