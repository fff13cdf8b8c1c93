"""The pool: packs, writers, publication, recovery, holds and the ownership catalog.

``SharedFilesystemStore`` (``store.py``) is the contract: publish immutable publications
into packs, read them back checked, and keep them alive while an owner names them.  It
holds one part per concern, each of which sees the store only through ``parts.py``::

    store.py        the calls, the writer of this process, fork and close rules
    opening.py      the declared deployment checked against the mount; the POOL marker
    arguments.py    publications normalised and checked before a byte is written
    publisher.py    publication (D1, D7): extents of the writer's open pack, idempotency
    retention.py    owners, readers' pins, staging and holds (D1-D4)
    receipts.py     other writers of the run: their receipts, retiring a writer
    collection.py   a collection as one store runs it; the states of packs

Beneath them: ``pack.py`` (append-only files of extents, sealed when done), ``writer.py``
(one writer incarnation: its lock, directory and packs), ``role_lock.py`` (a ``LOCK``
file whose ``flock`` says who holds a role), ``hold_owners.py`` (preparation holds),
``recovery.py`` (what a dead writer left: its index, its packs sealed in the catalog),
``refs.py``, ``records.py`` and ``ref_forms.py`` (references, records and their other
spellings), and ``catalog/`` (the ownership catalog: who needs which extents).

``straw.store``, ``straw.refs``, ``straw.writer``, ``straw.pack``, ``straw.recovery``,
``straw.holds`` and ``straw.holder`` are the old module paths: thin re-exports.
"""
