"""The batch builder (manager side): accepted groups in, one training batch per rollout
out, a shard per data-parallel rank, acknowledgement after training.

An accepted group is a completed prompt task (``prompt:...``) whose result holds
``group_records(group)``.  ``BatchBuilder`` scans the queue's commit log for them (its
*backlog*; a collection commit it meets takes its groups out of the backlog, so a group
is planned in at most one batch, RL2, whatever failed or restarted since), and
``next_batch(rollout_id)``:

1. **composes** the batch with the ``EnvironmentMix``: each environment's quota taken from
   its backlog, oldest weight version first (``scheduling_key``), then FIFO (commit
   position).  Until every quota is filled it returns None (the controller keeps
   generating: ``admits_fresh(env)`` says which environments may admit fresh prompts, the
   producer-side balancing of ``environments``); every batch keeps the proportions.
2. **collects** the selection durably: a control task ``collection:<rollout_id>`` acquired
   by id, its list of group receipts published (depending on the groups) and completed:
   the collection receipt.  ``batch_id = "batch:" + receipt.commit_id``.
3. **plans** (invariant RL3, a planned batch never changes): the plan (the selected groups'
   positions, commit ids and digests, each sample's token count, the rank partition, the
   conversion configuration and the parallel layout) and its digest are published and
   ``plan_batch`` is durable BEFORE any hook runs.  Planning an existing batch id again
   with another plan is ``IdempotencyConflict``; a batch already ready is returned again
   from its ready record without writing anything.
4. **runs the hooks**: ``reward_hook(rewards)`` (per group, the samples' raw rewards ->
   post-processed rewards, e.g. GRPO normalisation) then ``convert_hook(sample, reward)``
   per sample (a dict of train data; the default keeps tokens, lengths, rewards, indices,
   and the captures as lazy ``TensorRef``s: no capture byte is read or copied).  A hook
   that raises, or a reward that is not finite, leaves the batch planned and not ready;
   calling ``next_batch`` again replays the same plan.
5. **publishes every rank's shard** (samples divided by ``partition_by_tokens``), then one
   ready record naming them, then ``batch_ready`` (which saves the builder state with it,
   in one queue transaction) and returns one ``RankBatchRef`` per rank.

``finish_batch(batch_id)`` after training (invariant RL4, nothing acknowledged before its
training finished): the batch's input positions (its groups and its collection) become
processed in the designated consumer's progress and the batch finished, so the queue's
next collection releases them; with ``RolloutConfig.online_gc`` that collection runs in
the background (``online_gc``) and their packs are reclaimed once nothing else holds
them.  No other call acknowledges anything: ``batch_ready`` only advances the fetch
cursor.

Memory: the builder reads each accepted group's record 0 (token ids, rewards, metadata)
and never a capture tensor.  It decodes a group once: the scan's decoded group (checked
there, so a corrupt group is quarantined before any plan names it) is kept for the build
while the kept groups hold at most ``DECODED_TOKENS_KEPT`` tokens; past that budget (a
large backlog, or batches of long samples) a group is read again at build, one group at
a time, so the builder's memory stays bounded whatever the backlog.  ``decode_ahead``
(another thread's, while a build runs) decodes accepted groups before the scan reaches
them, into a table of its own under the same budget; the scan takes them from there.
The converted batch it holds while publishing is the samples' token arrays and
references.

The builder state (``state()``, JSON: scan cursor, backlog, consumer cursors, processed
positions, the count and newest ids of the finished batches, quarantined groups, the
``MixState``) is saved with every ready and finished batch as the consumer's state (in
its stored form, ``STORED_VERSION``: the backlog as one array per field;
``read_stored_state`` turns a record back into ``state()``'s form), so a
new builder on a recovered queue resumes from it; ``BatchBuilder(..., state=saved)``
restores one taken from a checkpoint.  Its size follows what is live, not the run's
length (the queue's progress record is what lists every finished batch).

A builder in a trainer process apart from the controller takes the served coordinator
as ``straw.rpc.RemoteCoordinator(url, token=...)`` (the server's trainer token).  The
consumer has one owner at a time; a trainer restarted after its predecessor died (its
token was not revoked: the coordinator lives on in the controller) opens with
``takeover=True``, which fences the predecessor's token, so one still alive fails its
next save instead of interleaving.

Example (runnable; a generation client completes prompt tasks in a real job)::

    import dataclasses, tempfile
    from straw import Coordinator, SharedFilesystemStore, TaskSpec
    from straw.rollout import BatchBuilder, EnvironmentMix, Sample, SampleGroup, Status
    from straw.rollout.codec import group_records

    root = tempfile.mkdtemp()
    store = SharedFilesystemStore(root, "job")
    coord = Coordinator(store, queue_id="rollout")
    prompt = store.publish([], submission_id="prompt-0")
    coord.submit_tasks("admit-0", [TaskSpec(f"prompt:{i}", input_ref=prompt)
                                   for i in range(2)])
    for a in coord.acquire("gen-0", 2, task_prefix="prompt:").assignments:
        g = SampleGroup(tuple(Sample("2+2?", tokens=(1, 2, 3, 4), response_length=2,
                                     status=Status.COMPLETED, reward=float(j),
                                     group_index=int(a.lease.task_id[7:]), index=j)
                              for j in range(2)))
        records, deps = group_records(g)
        records[0] = dataclasses.replace(records[0], metadata={
            **records[0].metadata, "task_id": a.lease.task_id,
            "attempt_id": a.lease.attempt_id})
        ref = store.publish(records, submission_id=f"group:{a.lease.attempt_id}",
                            dependencies=deps)
        coord.complete_task(a.lease, submission_id=f"result:{a.lease.attempt_id}",
                            result_ref=ref)
    builder = BatchBuilder(coord, store, EnvironmentMix.single(2), dp_size=2)
    refs = builder.next_batch(0)          # one small RankBatchRef per rank
    shard = refs[1].load(store, rank=1)   # on rank 1: only its shard
    builder.finish_batch(refs[0].batch_id)  # after training: acknowledges its inputs
    builder.close(); coord.close(); store.close()
"""

from __future__ import annotations

from .builder import BatchBuilder
from .convert import default_convert
from .entries import Accepted
from .state import read_stored_state

__all__ = ["BatchBuilder", "Accepted", "default_convert", "read_stored_state"]
