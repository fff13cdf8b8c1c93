"""The durable log: self-checking frames and the rules that make appends durable.

Both logs of straw are built from these parts: the pool's ownership catalog
(``straw.pool.catalog``) and the queue journal (``journal`` here).

* ``framing``: the frame format, and the scan that tells a torn tail from corruption (D6)
  by write groups.
* ``confirm``: confirm frames, the one protocol by which both logs make damage to an
  acknowledged write ``CorruptData`` instead of a torn tail.
* ``files``: whole files written atomically and durably (temp, fsync, rename, directory
  fsync): the snapshots of both logs, and the catalog's head copy.
* the queue journal: ``segments`` (its files and records), ``journal`` (its writer: group
  commit, rotation), ``journal_snapshot`` (snapshot, then deletion of what it covers) and
  ``recovery`` (the newest snapshot plus the suffix after it, D9).

What stays with each user, and why.  The catalog is one file shared by every client of a
pool under an ``flock``, so it repairs and compacts in place (its inode is the lock) and
combines concurrent adopts of one process into one transaction built under that lock; the
journal has one writer per epoch and never truncates (a fenced writer may still append to
its own segments), so it rotates segments, cuts at recorded cutoffs, and leads group
commits of sequence-numbered transactions.  Both open from a snapshot plus a suffix (D9),
each in its own format: the catalog's base frame names its snapshot, the journal's
snapshot file names its position.
"""
