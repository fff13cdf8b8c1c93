"""Tensors in packed publications: the ``tensor.v1`` format, publishing, ``TensorRef``
and checked loads.

The modules, each on the ones above it in this list::

    format.py      the tensor.v1 record format: dtypes, chunk size, the metadata check
                   (below the store too: ``read_tensor_range`` checks records with it)
    frameworks.py  torch (imported lazily, here alone) and NumPy's bfloat16
    threads.py     the thread pool, the blocks of a shared span, the helper-thread policy
    buffers.py     recycled load buffers
    records.py     one tensor as a tensor.v1 record and back, without a store
    binding.py     the store or read session a reference reads through, same-pool checks
    loads.py       checked reads into a new or the caller's buffer, on one thread or two

``straw.tensor`` and ``straw.tensor_format`` are the module paths callers import: thin
re-exports of these modules.  This package is core: it never imports ``straw.rollout``,
``straw.cli`` or ``straw.qualify``.
"""
