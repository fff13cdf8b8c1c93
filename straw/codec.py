"""The sample codec: nested Python samples as one publication of msgpack + tensor records.

The module path callers import; the codec lives in ``straw.sample_codec`` (its package
docstring states what is encoded, how, and what decoding refuses), and this module
re-exports its public names.
"""

from .sample_codec.decode import decode_sample as decode_sample
from .sample_codec.decode import sample_from_records as sample_from_records
from .sample_codec.encode import encode_sample as encode_sample
from .sample_codec.encode import sample_records as sample_records
from .sample_codec.layout import CODEC as CODEC
from .sample_codec.layout import FORMAT as FORMAT
from .sample_codec.layout import MAX_DEPTH as MAX_DEPTH
from .sample_codec.registry import DEFAULT_REGISTRY as DEFAULT_REGISTRY
from .sample_codec.registry import Registry as Registry
from .sample_codec.registry import register_dataclass as register_dataclass
from .sample_codec.registry import register_type as register_type

__all__ = ["CODEC", "MAX_DEPTH", "Registry", "DEFAULT_REGISTRY", "register_type",
           "register_dataclass",
           "encode_sample", "decode_sample", "sample_records", "sample_from_records"]
