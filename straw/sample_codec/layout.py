"""The msgpack layout of ``sample.v1`` (see ``straw.sample_codec``): the codec name, the
format version, the depth limit, and the codes of marker arrays and ext types that the
encoder writes and the decoder reads."""

from __future__ import annotations

import struct

import msgpack

CODEC = "sample.v1"
FORMAT = 1
MAX_DEPTH = 200

# marker arrays
_TUPLE, _DATACLASS, _CUSTOM, _MAP = 1, 2, 3, 4
# leaf ext types
_TENSOR, _TENSORREF, _NPSCALAR, _BIGINT, _BYTEARRAY, _IMAGE = 16, 17, 18, 19, 20, 21
_MARKERS = {c: msgpack.ExtType(c, b"") for c in (_TUPLE, _DATACLASS, _CUSTOM, _MAP)}
# the first item of each kind of marker array, as the encoder writes it
_TUPLE_MARKER, _DATACLASS_MARKER, _CUSTOM_MARKER, _MAP_MARKER = (
    _MARKERS[_TUPLE], _MARKERS[_DATACLASS], _MARKERS[_CUSTOM], _MARKERS[_MAP])
_U32 = struct.Struct("<I")
