"""The queue: one coordinator per queue, the single writer of its journal.

The ``Coordinator`` (``coordinator.py``; callers import it as ``straw.coordinator``) is assembled
from one class per concern, each in its own module and each built on the ones below it
(a layer uses only what is beneath it; completions and the consumer side are two branches
over the leases)::

    Coordinator        coordinator.py      argument checks, then the pipeline with the rule
    QueueCompletions   completions.py      results accepted exactly once (D7): one, many,
                                           or one with the worker's next grant
    QueueViews         views.py            reads of the state, inspection, metrics
    QueueBatches       batches.py          batches and checkpoints
    QueueConsumers     consumers.py        consumers: tokens, saves, acknowledgements, rewinds
    QueueLeases        leases.py           grants, renewals, lease checks, expiry, readers (D5)
    QueueEpochs        epochs.py           exclusivity, epochs, recovery, fencing (D8, D9)
    CommitPipeline     pipeline.py         mutex, adopt (D2), enqueue, wait, reply; collection

Beside them, ``rules.py`` holds the decisions themselves: one pure function per spec
action (``spec/actions.py``), which reads the ``QueueState`` and the call's arguments and
returns the journal transaction and reply, or raises the straw error (its header maps
spec actions to methods and transaction types; ``rules_consumers.py`` holds the
consumers', batches' and checkpoints'); ``checks.py`` the
argument checks shared by every call; ``replay.py`` the state of a journal (recovery,
operator views).

The state the rules read and the journal's transactions change (pure, no I/O):
``state.py`` (``QueueState``: ``apply``, retention, snapshots), ``tasks.py`` (tasks and
their table), ``commits.py`` (the commit log, submissions and request answers),
``records.py`` (consumers, batches, checkpoints); ``history.py`` the immutable history
segments a snapshot moves finished state to (D9).  Names: ``ids.py`` (queue ids and
their directories), ``names.py`` (attempt ids and tokens derived from a queue's
identity), ``marker.py`` (straw-queue's queue marker).

This package is core: it never imports ``straw.rollout``, ``straw.cli`` or
``straw.qualify``.
"""
