"""The ``tensor.v1`` record format: the module path the store's ``read_tensor_range`` and
the rollout archives import; it lives in ``straw.tensors.format``."""

from .tensors.format import _HEX as _HEX
from .tensors.format import CHUNK_BYTES as CHUNK_BYTES
from .tensors.format import CODEC as CODEC
from .tensors.format import DTYPES as DTYPES
from .tensors.format import MAX_DIMS as MAX_DIMS
from .tensors.format import SOURCES as SOURCES
from .tensors.format import _check_meta as _check_meta
from .tensors.format import check_expected as check_expected
from .tensors.format import checksum_list as checksum_list

__all__ = ["CHUNK_BYTES", "CODEC", "DTYPES", "MAX_DIMS", "SOURCES", "check_expected",
           "checksum_list"]
