"""The sample codec: nested Python samples as one publication of msgpack + tensor records.

``straw.codec`` is the module path callers import: a thin re-export of this package.

API::

    ref = encode_sample(store, sample, *, submission_id, dependencies=(), registry=None)
    sample = decode_sample(store, ref, *, lazy_tensors_over=None, registry=None)
    records, dependencies = sample_records(sample, *, registry=None, tokens=None)
    sample = sample_from_records(records, *, tensors=None, lazy_tensors_over=None)
    register_type(cls, tag, version, encode, decode)      # the default registry
    register_dataclass(cls, name=None)                    # the default registry
    Registry().register(cls, tag, version, encode, decode)  # a private one
    Registry().register_dataclass(cls, name=None)

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
  a dependency of the sample's publication (no bytes copied); ``RecordSetRef``s (a
  built-in registered type of every ``Registry``, tag ``straw.RecordSetRef``, decoded
  through ``RecordSetRef.from_dict`` and so checked);
* PIL images, as PNG (when Pillow is importable);
* registered dataclasses (``register_dataclass(cls)``, in the writer and in every
  reader), field by field, under a name (default ``"module:qualname"``), restored
  without calling ``__init__``; the registered class must have the fields the sample
  has.  An unregistered dataclass is a ``TypeError`` on encode, and a sample naming a
  dataclass the reader's registry does not hold is ``UnsupportedSchema``: the decoder
  never looks classes up by name in loaded modules, so a crafted record cannot make it
  instantiate an arbitrary class;
* registered types: ``register_type(cls, tag, version, encode, decode)``; ``encode(obj)``
  returns any encodable value, ``decode(value)`` rebuilds the object.  Encoding uses the
  highest version registered for ``cls``; every registered version stays decodable.

Rejections: an unsupported type raises ``TypeError`` naming the field path
(``sample['obs'][3].foo``); a cycle raises ``ValueError``; nesting deeper than
``MAX_DEPTH`` containers raises ``ValueError``.  On decode, an unknown ext type, marker
kind, type tag or version, or dataclass name raises ``UnsupportedSchema``; a structure
that does not parse (msgpack errors, a truncated or malformed ext payload, a marker out
of place, a registered decoder failing on its value) raises ``CorruptData`` naming what;
references inside fail as references do (``InvalidReference``).  Never pickle: the
decoder only builds the types listed above.

``lazy_tensors_over=N`` leaves tensors larger than N bytes as lazy ``TensorRef``s (load
them, or read rows, later); the others load eagerly (torch when published from torch and
torch is importable, else NumPy; see ``straw.tensor``).

msgpack layout: plain values, arrays and maps as such; a marker array
``[ExtType(code, b""), ...]`` for tuples, dataclasses and registered types (users cannot
put ``ExtType`` values in samples, so markers are unambiguous); ext types for tensors,
NumPy scalars, big ints, bytearrays and images.

The modules::

    layout.py    the msgpack layout: codec name, format, markers and ext type codes
    registry.py  the registered types and dataclasses: the only classes the decoder builds
    encode.py    a sample as records (one walk, or msgpack at once for plain values)
    decode.py    records back into the sample, every malformed piece ``CorruptData``
"""
