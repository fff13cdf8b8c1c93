"""straw.rollout: the RL layer above the queue (issue 14), framework-neutral.

Prompts in, groups scheduled by stage and staleness, groups out, batches to every training
rank.  No vime, Megatron, vLLM, Ray or torch imports (NumPy only); it uses the core's public
API only.  This first part is the queue-independent core, each module one concern:

* ``samples``      Sample / SampleGroup values, validation, stage (ready 2 / partial 1 /
                   fresh 0), capture coverage;
* ``scheduling``   scheduling key (oldest numeric generated-token version), priority,
                   staleness and its metrics, the optional staleness bound and its policy;
* ``data_source``  dataset -> prompt groups by seeded epochs, the JSON cursor, refills
                   that move nothing until committed (exactly-once admission per epoch);
* ``environments`` weighted environments: per-batch quotas, producer-side backlog draining;
* ``codec``        SampleGroup <-> records (the core's ``sample.v1``/``tensor.v1``), pure.

The queue wiring (below) of the controller and the generation client:

* ``controller``   ``RolloutController``: the job's Coordinator and DataSource, ``take``
                   with refills (RL1), serving version, staleness of what is accepted;
* ``generation``   ``GenerationClient``: leases, heartbeat, groups returned by stage;
* ``remote``       the controller served to generation processes (``straw.rpc``).

On the queue (the batch builder, below): ``builder`` (``BatchBuilder``), ``shards`` (rank
partition, ``RankBatchRef``, identity checks), ``online_gc`` (background collection).
Debug archives: ``archive`` (``RolloutArchive``: indexed, retained rollouts, issue 16).

The next step: the queue wiring
===============================

Everything below calls the Coordinator and the store; it should be written against their
final (straw-queue 0.1.6) signatures, with these pure pieces doing every decision.

**Controller** (one per job; owns the ``Coordinator(store, queue_id=..., namespace=True,
exclusive_owner=..., lease_seconds=300)`` and one ``DataSource``):

``take(worker_id, count)``:
  1. ``acquire(worker_id, count, task_prefix=PROMPT_PREFIX)``; if not ``empty``, return it.
  2. Under the producer lock: acquire again (another worker may have refilled); if still
     empty, ``source.reset(cursor_from_producer_state(coord.producer_state(PRODUCER_ID)))``
     (the committed cursor: a failed refill cannot skip prompts), then
     ``refill = source.refill(count)``.
  3. Publish every group: ``records, deps = group_records(g)`` for each, one
     ``store.publish_many([Publication(records, deps)...], submission_id=
     "input:" + refill.request_id)``.
  4. ONE transaction: ``submit_tasks(refill.request_id, [TaskSpec(task_id, ref,
     metadata={"group_index": ...}, priority=0, scheduling_key=SUBMITTED_PROMPT_KEY,
     estimated_tokens=ref.tokens)...], producer_id=PRODUCER_ID,
     producer_state=refill.producer_state)``; then ``source.commit(refill)``.  A lost reply
     is retried with the same request id (D7).  This is invariant RL1.
  5. Acquire again and return leases + refs (payloads never travel through the RPC).

**Generation client** (one per generation process; a heartbeat thread renews its leases
every ``max(0.1, lease_seconds / 3)`` s, ``StaleAttempt`` drops a lease locally):

* read inputs: ``group_from_records(store.read(ref))`` inside one read session;
* return a group (``add_samples``): if ``not captures_cover_group(g)``:
  ``release_tasks([lease], request_id="release:<attempt_id>")`` (no failure spent; the task
  resumes from its previous durable input).  Else ``verdict = decide(g, serving_version,
  bound)``; REJECT -> ``fail_task(lease, request_id="reject:<attempt_id>", failure=
  {"category": "Stale", "reason": verdict.reason}, retryable=False)``; REQUEUE -> return
  ``restart_from_prompt(g)`` instead of ``g``.  Publish ``group_records(g)``, then
  ``yield_tasks([{lease, input_ref, priority=priority(g), scheduling_key=
  scheduling_key(g), metadata={stage, returned: True}}], request_id="return:" +
  digest(updates))`` (publish first, then one transaction);
* complete a ready group (``classify(g) is Stage.READY``): publish with submission
  ``group:<attempt_id>``, ``complete_task(lease, submission_id="result:<attempt_id>",
  result_ref=ref, result_digest=ref.digest)`` -> receipt (a retry returns the same
  receipt; other content under the attempt is ``IdempotencyConflict``);
* reject a filtered group: ``fail_task(lease, request_id="reject:<attempt_id>",
  failure={"category": "Filtered", "reason": r}, retryable=False)``;
* ``close()`` releases its leases (``release_tasks(leases, request_id=...)``).

**Batch builder** (manager side; built in ``builder``, whose docstring is the reference):

* collection: a control task ``collection:<rollout_id>`` (``control=True``) acquired by id,
  its list of group refs published and completed -> the collection receipt;
* plan: ``batch_id = "batch:" + receipt.commit_id``; plan digest over the selected
  samples' positions, the conversion configuration and the parallel layout;
  ``plan_batch(batch_id, positions)`` is durable BEFORE any reward or conversion hook runs
  (invariant: a planned batch never changes; reusing the id with another plan is an error;
  a ready batch is returned again without writing);
* compose: ``EnvironmentMix.compose(state, backlog)`` picks how many groups of each
  environment the batch takes from the accepted backlog and how many fresh admissions each
  environment may make (``admits_fresh``); its ``MixState`` is saved with the builder state;
* shards: samples split among data-parallel ranks balanced by ``SampleGroup.tokens``; every
  rank's shard published (captures stay ``TensorRef``s: ``group_from_records(...,
  tensors=TensorRef.from_record_set_many(store, ref), lazy_tensors_over=N)``), then
  ``batch_ready``; each rank gets a small picklable reference and loads only its shard;
* ``finish_batch`` after training acknowledges the inputs (consumer cursor), never before.

**Spec** (``spec/rollout/``, invariant ids ``RL*``): RL1 exactly-once dataset admission per
epoch (cursor and tasks committed together: stated and tested on the pure part in
``data_source``); RL2 a group accepted at most once and never lost once accepted; RL3 a
planned batch never changes (plan before hooks); RL4 nothing acknowledged before its
training finished; with mutants for each (cursor saved apart from its tasks, hooks before
the plan is durable, acknowledgement before training).
"""

from __future__ import annotations

from .archive import RolloutArchive
from .builder import COLLECTION_PREFIX, Accepted, BatchBuilder, default_convert
from .codec import GROUP_SCHEMA, GROUP_VERSION, group_from_records, group_records
from .config import RolloutConfig
from .controller import RolloutController
from .data_source import (
    MAX_REFILL,
    MIN_REFILL,
    PRODUCER_ID,
    PROMPT_PREFIX,
    Cursor,
    DataSource,
    Refill,
    cursor_from_producer_state,
    producer_state,
    refill_size,
    task_id,
)
from .environments import Composition, EnvironmentMix, MixState
from .generation import GenerationClient, Returned
from .online_gc import OnlineGC, OnlineGCFailed
from .samples import (
    Sample,
    SampleGroup,
    Stage,
    Status,
    VersionSpan,
    captures_cover,
    captures_cover_group,
    classify,
)
from .scheduling import (
    NO_VERSION_KEY,
    SUBMITTED_PROMPT_KEY,
    Decision,
    StalenessBound,
    StalenessPolicy,
    Verdict,
    acquisition_order,
    decide,
    numeric_version,
    priority,
    queue_order,
    restart_from_prompt,
    scheduling_key,
    staleness,
    staleness_metrics,
)
from .shards import RankBatchRef, RankShard, check_batch_identities, partition_by_tokens

__all__ = [
    "RolloutConfig", "RolloutController", "GenerationClient", "Returned",
    "Sample", "SampleGroup", "Stage", "Status", "VersionSpan", "classify", "captures_cover",
    "captures_cover_group",
    "NO_VERSION_KEY", "SUBMITTED_PROMPT_KEY", "numeric_version", "scheduling_key", "priority",
    "queue_order", "acquisition_order", "staleness", "staleness_metrics", "StalenessBound",
    "StalenessPolicy", "Decision", "Verdict", "decide", "restart_from_prompt",
    "Cursor", "DataSource", "Refill", "MIN_REFILL", "MAX_REFILL", "PRODUCER_ID",
    "PROMPT_PREFIX", "producer_state", "cursor_from_producer_state", "refill_size", "task_id",
    "EnvironmentMix", "MixState", "Composition",
    "GROUP_SCHEMA", "GROUP_VERSION", "group_records", "group_from_records",
    "BatchBuilder", "Accepted", "default_convert", "COLLECTION_PREFIX",
    "RankBatchRef", "RankShard", "check_batch_identities", "partition_by_tokens",
    "OnlineGC", "OnlineGCFailed",
    "RolloutArchive",
]
