"""Pure helpers of the specification, with CrossHair contracts (PEP 316 docstring syntax).

Role: the small computations the protocol's rules are built from — scheduling order, lease
liveness, staleness (policy lag), dependency closure, GC reachability, frame classification and
byte ranges. They are total, side-effect free and deterministic; `just crosshair` checks every
`pre:`/`post:` contract symbolically within a time budget. The actions in `spec/actions.py`
and the invariants in `spec/invariants.py` call them, so the contracts are also the rules.

Invariants stated here: Q4 (scheduling order is a total preorder agreeing with priority desc,
key asc, FIFO asc), D4 (reclaimable packs hold no reachable extent), D6 (torn vs corrupt).
"""

from __future__ import annotations

TaskOrder = tuple[int, int, int]
"""(priority, scheduling_key_rank, fifo_position) of a task. The engine's scheduling keys are
strings compared lexicographically; the spec abstracts a key to its rank among the keys in play
(an order-preserving map), which keeps the contracts in integer arithmetic. (CrossHair 0.0.113
reports spurious counterexamples for symbolic string comparisons involving NUL characters.)"""


def order_key(priority: int, key: int, fifo: int) -> tuple[int, int, int]:
    """Sort key: smaller sorts first. Priority descending, then key ascending, then FIFO.

    post: __return__[0] == -priority
    post: __return__[1] == key and __return__[2] == fifo
    """
    return (-priority, key, fifo)


def schedules_before(a: TaskOrder, b: TaskOrder) -> bool:
    """True when a task ordered `a` may be handed out no later than one ordered `b` (Q4).

    post: __return__ == (order_key(*a) <= order_key(*b))
    post: __return__ or schedules_before(b, a)
    post: not (a[0] > b[0]) or __return__
    post: not (a[0] == b[0] and a[1] < b[1]) or __return__
    post: not (a[0] == b[0] and a[1] == b[1] and a[2] < b[2]) or __return__
    post: not (a[0] < b[0]) or not __return__
    """
    if a[0] != b[0]:
        return a[0] > b[0]
    if a[1] != b[1]:
        return a[1] < b[1]
    return a[2] <= b[2]


def order_is_transitive(a: TaskOrder, b: TaskOrder, c: TaskOrder) -> bool:
    """Witness for CrossHair that schedules_before is transitive.

    post: __return__
    """
    if schedules_before(a, b) and schedules_before(b, c):
        return schedules_before(a, c)
    return True


def best_task(candidates: list[TaskOrder]) -> int:
    """Index of the first task to hand out among candidates (ties: the earliest index).

    pre: len(candidates) > 0
    post: 0 <= __return__ < len(candidates)
    post: all(schedules_before(candidates[__return__], c) for c in candidates)
    """
    best = 0
    for i in range(1, len(candidates)):
        if not schedules_before(candidates[best], candidates[i]):
            best = i
    return best


def lease_is_live(
    lease_attempt: int,
    lease_epoch: int,
    task_leased: bool,
    task_attempt: int,
    task_lease_epoch: int,
    task_expired: bool,
) -> bool:
    """A lease may commit (Q2, Q3, D5, D8) iff the task is leased under exactly this attempt and
    epoch and its deadline has not passed.

    post: not __return__ or (task_leased and not task_expired)
    post: not __return__ or (lease_attempt == task_attempt and lease_epoch == task_lease_epoch)
    """
    return (
        task_leased
        and not task_expired
        and lease_attempt == task_attempt
        and lease_epoch == task_lease_epoch
    )


def staleness(current: int, generating: list[int]) -> int | None:
    """Policy lag of a sample group: current version minus the oldest version that generated
    it. Undefined (None) when there is no generating version or one is ahead of current.

    post: (__return__ is None) == (len(generating) == 0 or any(g > current for g in generating))
    post: __return__ is None or __return__ >= 0
    post: __return__ is None or __return__ == current - min(generating)
    """
    if not generating:
        return None
    oldest = generating[0]
    for g in generating:
        if g > current:
            return None
        if g < oldest:
            oldest = g
    return current - oldest


def dependency_closure(roots: frozenset[int], edges: tuple[tuple[int, int], ...]) -> frozenset[int]:
    """Every extent reachable from roots through (extent, dependency) edges.

    post: roots <= __return__
    post: all(d in __return__ for (e, d) in edges if e in __return__)
    post: all(x in roots or _has_parent(x, __return__, edges) for x in __return__)
    """
    seen = set(roots)
    frontier = list(roots)
    while frontier:
        x = frontier.pop()
        for e, d in edges:
            if e == x and d not in seen:
                seen.add(d)
                frontier.append(d)
    return frozenset(seen)


def staged_closure(e: int, staged: frozenset[int],
                   edges: tuple[tuple[int, int], ...]) -> frozenset[int]:
    """e and every staged extent reachable from it through staged extents (what
    release_publications([e]) unstages).

    pre: e in staged
    post: e in __return__
    post: __return__ <= staged
    post: all(d in __return__ for (x, d) in edges if x in __return__ and d in staged)
    """
    seen = {e}
    frontier = [e]
    while frontier:
        x = frontier.pop()
        for src, d in edges:
            if src == x and d in staged and d not in seen:
                seen.add(d)
                frontier.append(d)
    return frozenset(seen)


def _has_parent(x: int, within: frozenset[int], edges: tuple[tuple[int, int], ...]) -> bool:
    """Some extent in `within` depends on x."""
    return any(e in within and d == x for (e, d) in edges)


def _holds_any(p: int, extents: frozenset[int], pack_of: tuple[int, ...]) -> bool:
    """Pack p holds one of `extents`."""
    return any(0 <= e < len(pack_of) and pack_of[e] == p for e in extents)


def unreachable_sealed_packs(
    sealed: frozenset[int], pack_of: tuple[int, ...], reachable: frozenset[int]
) -> frozenset[int]:
    """The packs a collection may tombstone (D4): sealed and holding no reachable extent.
    One reachable extent keeps its whole pack.

    post: __return__ <= sealed
    post: all(pack_of[e] not in __return__ for e in reachable if 0 <= e < len(pack_of))
    post: all(p in __return__ or _holds_any(p, reachable, pack_of) for p in sealed)
    """
    live = {pack_of[e] for e in reachable if 0 <= e < len(pack_of)}
    return frozenset(p for p in sealed if p not in live)


def classify_frame(declared_len: int, available: int, checksum_ok: bool) -> str:
    """D6: a complete frame that fails its checksum is corruption; only an incomplete frame is a
    torn tail (which recovery may cut off when it is the final frame).

    pre: declared_len >= 0 and available >= 0
    post: __return__ in ("ok", "torn", "corrupt")
    post: (__return__ == "torn") == (available < declared_len)
    post: (__return__ == "corrupt") == (available >= declared_len and not checksum_ok)
    """
    if available < declared_len:
        return "torn"
    return "ok" if checksum_ok else "corrupt"


def range_within(offset: int, size: int, file_size: int) -> bool:
    """A reference's byte range lies inside a file of file_size bytes.

    post: __return__ == (offset >= 0 and size >= 0 and offset + size <= file_size)
    post: not __return__ or file_size >= 0
    """
    return offset >= 0 and size >= 0 and offset + size <= file_size


def sparse_released(i: int, acked: bool, ck_cursor: int | None) -> bool:
    """Commit i, at or past the release threshold, no longer needs its result retained by the
    queue: the consumer acknowledged it out of order (a processed position of its progress
    record) and no checkpoint keeps it (a rewind to the checkpoint's cursor would read it).

    pre: i >= 0
    post: not __return__ or acked
    post: not __return__ or ck_cursor is None or i < ck_cursor
    """
    return acked and (ck_cursor is None or i < ck_cursor)


def release_threshold(cursor: int, ck_cursor: int | None) -> int:
    """Commits at index >= this are still needed by the consumer or by a rewind to its
    checkpoint, so the queue owner keeps their results (D2).

    pre: cursor >= 0
    post: __return__ <= cursor
    post: ck_cursor is None or __return__ <= ck_cursor
    post: __return__ == cursor or __return__ == ck_cursor
    """
    if ck_cursor is None or cursor <= ck_cursor:
        return cursor
    return ck_cursor
