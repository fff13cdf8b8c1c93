"""Protocol switches: one boolean per deliberately broken variant (a *mutant*).

Role: the spec's actions consult a `Mutants` value where the broken rule lives (one place per
switch; `journal_before_retain` swaps two steps, so both read it). The default
value `CORRECT` (every switch off) is the protocol straw implements. Turning one switch on breaks
one obligation; the model checker must then find a counterexample (see `model/explore.py`).

Each field's comment names the place in `spec/actions.py` that reads it and the invariant that
should catch it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class Mutants:
    """One switch per mutant; all False is the correct protocol."""

    # D1: publish replies with the reference before the data fsync (write_extent).
    reply_before_fsync: bool = False
    # D4: publish with dependencies does not require the dependencies to be protected.
    dependency_not_protected: bool = False
    # D4: retain/pin do not serialise with collection (the collector's lock is not honoured).
    collect_without_lock: bool = False
    # D4: the collector's reachability ignores dependency edges.
    gc_ignores_dependencies: bool = False
    # D3: the collector unlinks a planned pack without waiting for its durable tombstone.
    unlink_before_tombstone: bool = False
    # D3: a writer may append to (re-create) a pack path that carries a tombstone.
    reclaimed_path_reused: bool = False
    # D3: retain/pin accept a reference whose pack carries a tombstone (usable()).
    retain_ignores_tombstone: bool = False
    # L1: a collector only unlinks packs of its own plan, so an interrupted collection's
    # tombstoned packs are never finished.
    interrupted_collection_abandoned: bool = False
    # D2: the coordinator journals a submission before retaining its input under the queue owner.
    journal_before_retain: bool = False
    # D2: the producer drops staging once the submission is sent, before the journal is durable.
    staging_released_before_journal: bool = False
    # R1: release_publications drops its dependencies' staging too, but only checks that the
    # submits naming the released publication itself were acknowledged.
    release_closure_unchecked: bool = False
    # D2: finishing a task removes its input from every owner, not just the queue's owner.
    release_removes_shared_root: bool = False
    # D5: lease expiry also drops the worker's read pin.
    pin_dropped_on_expiry: bool = False
    # R1: rewinding a consumer to a checkpoint does not re-adopt the checkpoint's roots.
    checkpoint_rewind_without_readopt: bool = False
    # D2: releasing an out-of-order acknowledgement ignores the checkpoint's cursor
    # (journal_named, as the coordinator trims).
    sparse_ack_ignores_checkpoint: bool = False
    # D2: restoring an older consumer view does not re-adopt the history it needs (restore).
    restore_without_readopt: bool = False
    # D4: restoring an older consumer view re-adopts history without checking it is still
    # usable, so a reclaimed result becomes a root (restore).
    restore_skips_usable_check: bool = False
    # D5: acquire does not journal the lease grant (coord_recover): recovery forgets it, rolls
    # the attempt counter back and loses the reader's protection the grant recorded.
    lease_grant_not_journaled: bool = False
    # Q3: complete_and_acquire's combined path does not check that the completed lease is
    # live (complete_and_acquire).
    combined_commit_skips_liveness: bool = False
    # Q5: complete_and_acquire's grant does not pin the new task's input for the worker's
    # read, as acquire's does (complete_and_acquire).
    combined_grant_without_read_pin: bool = False
    # Q3: completion does not check the abstract expiry flag.
    expired_lease_commits: bool = False
    # D7: a retried completion (same submission id) is committed again instead of answered
    # with the original receipt.
    retry_without_idempotency: bool = False
    # D8: a resumed old coordinator does not check the durable epoch before acknowledging.
    fencing_skipped: bool = False
    # D9: a recovering coordinator serves before its new epoch is durable.
    epoch_not_durable_before_service: bool = False
    # Q2: acquire does not increment the attempt, so a re-lease has the old lease's identity.
    lease_attempt_not_incremented: bool = False
    # Q4: acquire orders by scheduling key then FIFO, ignoring priority.
    order_ignores_priority: bool = False
    # L2: expired leases are never requeued by the coordinator.
    expired_task_never_requeued: bool = False
    # Q6: retire_worker revokes the retired worker's leases without spending their budget
    # (a task whose workers keep dying would be retried forever).
    retire_spends_no_budget: bool = False
    # Q6: coord_recover revokes the older epoch's leases without spending their budget
    # although the configuration's policy spends it (recovery_spends_budget).
    recovery_spends_no_budget: bool = False
    # Q7: a retried request (fail_task after a lost reply) is checked against the lease before
    # its request id, so a fail that took effect is answered StaleAttempt.
    request_retry_refused: bool = False
    # CS1: compaction writes its head copy (and so truncates the catalog) before its
    # snapshot is durable (cat_head_copy).
    catalog_truncated_before_snapshot_durable: bool = False
    # CS1: the new base frame omits what was appended while the snapshot was written
    # (cat_head_copy).
    compaction_drops_suffix: bool = False
    # CS1: compaction deletes older snapshots when it starts, before the catalog's base
    # names the new one (cat_snapshot).
    old_snapshot_deleted_early: bool = False
    # H1: the journal snapshot naming a new history segment is written before the segment
    # is durable (hist_snapshot).
    history_snapshot_before_segment_durable: bool = False
    # H1: the history segments the durable snapshot names are deleted (folded away) before
    # the snapshot naming their replacement is durable (hist_cleanup).
    history_deleted_before_snapshot: bool = False


CORRECT = Mutants()

MUTANT_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Mutants))


def mutant(name: str) -> Mutants:
    """The protocol with exactly the switch `name` turned on."""
    if name not in MUTANT_NAMES:
        raise ValueError(f"unknown mutant {name!r}; known: {', '.join(MUTANT_NAMES)}")
    return replace(CORRECT, **{name: True})
