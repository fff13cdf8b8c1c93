"""The ownership catalog of a pool: which packs exist, who needs which extents, what may be
reclaimed.

``state`` (the pure state and its operations), ``roots`` (compact root sets), ``log`` (the
catalog file under the pool lock: replay, appends with confirm frames, torn tails,
headroom), ``compaction`` (snapshot + suffix), ``repair`` (the operator's repair in
place), ``snapshot`` (the snapshot file format), ``read`` (reading without the lock) and
``catalog`` (the operations: retain, release, adopt, collection).
"""
