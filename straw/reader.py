"""Checked reads of publications: the module path callers import; the code lives in
``straw.read``."""

from .read.buffers import fresh_bytes as fresh_bytes
from .read.extents import MANIFEST_CODEC as MANIFEST_CODEC
from .read.extents import ExtentInfo as ExtentInfo
from .read.extents import envelope_dict as envelope_dict
from .read.extents import manifest_dict as manifest_dict
from .read.session import ReadSession as ReadSession
from .read.session import drop_reclaimed as drop_reclaimed
from .read.visibility import PackStatus as PackStatus
from .read.visibility import PackStatusFn as PackStatusFn

__all__ = [
    "MANIFEST_CODEC", "ExtentInfo", "PackStatus", "PackStatusFn", "ReadSession",
    "drop_reclaimed", "envelope_dict", "fresh_bytes", "manifest_dict",
]
