"""Checked byte ranges of one record: the module path callers import; the code lives in
``straw.read.ranges``."""

from .read.ranges import PIECE as PIECE
from .read.ranges import RecordSource as RecordSource
from .read.ranges import checked_span as checked_span
from .read.ranges import read_range as read_range
from .read.ranges import tensor_chunks as tensor_chunks

__all__ = ["PIECE", "RecordSource", "checked_span", "read_range", "tensor_chunks"]
