"""Checked reads of publications: the module path callers import; the code lives in
``straw.read`` (``straw.read.session``)."""

from .read.session import MANIFEST_CODEC as MANIFEST_CODEC
from .read.session import ExtentInfo as ExtentInfo
from .read.session import PackStatus as PackStatus
from .read.session import PackStatusFn as PackStatusFn
from .read.session import ReadSession as ReadSession
from .read.session import drop_reclaimed as drop_reclaimed
from .read.session import envelope_dict as envelope_dict
from .read.session import fresh_bytes as fresh_bytes
from .read.session import manifest_dict as manifest_dict

__all__ = [
    "MANIFEST_CODEC", "ExtentInfo", "PackStatus", "PackStatusFn", "ReadSession",
    "drop_reclaimed", "envelope_dict", "fresh_bytes", "manifest_dict",
]
