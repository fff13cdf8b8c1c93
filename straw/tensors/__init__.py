"""Tensors in packed publications: zero-copy writes, checked reads of whole tensors or rows.

``publish_tensors(store, {name: tensor}, *, submission_id)`` publishes NumPy arrays and
torch tensors as ``tensor.v1`` records of one publication and returns one ``TensorRef``
per tensor; ``ref.load()``, ``ref[a:b]`` and ``ref[i]`` read them back, verifying every
checksum chunk they touch and nothing else.  torch is optional: it is imported lazily,
and everything works on NumPy alone.

The modules, each using only the ones above it in this list::

    format.py      the tensor.v1 record format: dtypes, chunk size, the metadata check
                   (below the store too: ``read_tensor_range`` checks records with it)
    frameworks.py  torch (imported lazily, here alone) and NumPy's bfloat16
    threads.py     the thread pool, the blocks of a shared span, the helper-thread policy
    buffers.py     recycled load buffers
    records.py     one tensor as a tensor.v1 record and back, without a store
    binding.py     the store or read session a reference reads through, same-pool checks
    loads.py       checked reads into a new or the caller's buffer, on one thread or two
    serial.py      a reference's dict form (this straw's and an earlier one's)
    ref.py         TensorRef: description, binding, loads, sharing, new versions, and
                   references made from a publication's manifest
    publish.py     publish_tensors and the release of their staging protection

``straw.tensor`` and ``straw.tensor_format`` are the module paths callers import: thin
re-exports of these modules.  This package is core: it never imports ``straw.rollout``,
``straw.cli`` or ``straw.qualify``.
"""
