"""straw.rollout: the RL layer above the queue, framework-neutral.

Prompts in, groups scheduled by stage and staleness, groups out, batches to every training
rank.  No vime, Megatron, vLLM, Ray or torch imports (NumPy only; torch lazily in
``archive_pt``, Ray in ``ray``); it uses the core's public
API only (``tests/rollout/test_layering.py``).  Each module has one concern.

The pure parts, which make every decision:

* ``config``       ``RolloutConfig``: the seed's options and defaults;
* ``samples``      Sample / SampleGroup values, validation, stage (ready 2 / partial 1 /
                   fresh 0), capture coverage;
* ``scheduling``   scheduling key (oldest numeric generated-token version), priority,
                   staleness and its metrics, the optional staleness bound and its policy;
* ``data_source``  dataset -> prompt groups by seeded epochs, the JSON cursor, refills
                   that move nothing until committed (exactly-once admission per epoch);
* ``environments`` weighted environments: per-batch quotas, producer-side backlog draining;
* ``codec``        SampleGroup <-> records (the core's ``sample.v1``/``tensor.v1``).

The parts on the queue (each module's docstring is its reference, with a runnable example):

* ``controller``   ``RolloutController`` (one per job): the Coordinator and the DataSource,
                   ``take`` with refills published first, then tasks and cursor in ONE
                   transaction (RL1), the serving version, staleness of what is accepted;
* ``generation``   ``GenerationClient`` (one per generation process): leases and their
                   heartbeat, groups returned by stage (completed with a receipt, yielded
                   for continuation, rejected, released), every call safe to retry;
* ``remote``       the controller served to generation processes (``straw.rpc``; a
                   trainer's builder takes ``straw.rpc.RemoteCoordinator``);
* ``builder``      ``BatchBuilder`` (manager side): accepted groups -> a collection, a plan
                   durable before any hook (RL3), rank shards, ready; ``finish_batch``
                   after training is the only acknowledgement (RL4);
* ``shards``       the rank partition by tokens, ``RankBatchRef``, identity checks;
* ``online_gc``    background collection after acknowledgements, failures latched;
* ``archive``      ``RolloutArchive``: indexed, retained debug rollouts;
                   ``archive_pt`` their self-contained ``.pt`` dumps (the one module
                   that may import torch, lazily); ``replay`` which archived groups a
                   train-only job replays (selection and checks, pure) and
                   ``replay_archives``, their isolated replay queue; ``replay_group``
                   an archived group by reference (no sample byte copied).
* ``generate``     the generate-function protocol (async, abortable, version-tagged): the
                   one seam between an inference engine and the layer;
* ``producer``     generation slots over a ``GenerationClient`` with an admission pause
                   (in-flight groups durable as continuations) and resume;
* ``toy``          a toy task and a tiny NumPy policy implementing the generate-function
                   protocol: the engine of ``python3 dev.py demo``;
* ``ray``          (a package, the ``ray`` extra, the only importer of Ray) the distributed
                   mode: a controller actor, a generation actor per node, the storage probe.

Checkpoints, restore and branches (import them from their modules):

* ``checkpoint``   ``Checkpointer``: the joint checkpoint of step k (model files, live
                   queue and builder state, retained payloads, the commit marker last, RL9);
* ``resolve``      ``resolve_checkpoint``: load/save/step -> which checkpoint, which mode
                   (new, recover, exact, salvage, empty), which destination branch;
* ``restore``      ``open_job``: the exact and salvage restores (RL6, RL8), the mode rule;
* ``isolated``     ``seed_isolated_queue``: a new queue seeded from saved state (shared by
                   restore and the archive's replay; RL7);
* ``savelock``     one controller per save directory (a flock that dies with its holder);
* ``checkpoint_files``, ``checkpoint_errors``: the directory layout and the errors.

The layer's state machine is ``spec/rollout.py`` (RL1-RL12, section 9 of ``spec/SPEC.md``),
explored with a mutant per rule by ``just model``; ``tests/conformance/
test_rollout_conformance.py`` drives this package against it on SimFS with crashes, and
``fault_injection/rollout_fuzz.py`` kills its processes at random in ``just fuzz``.
"""

from __future__ import annotations

from .archive import RolloutArchive
from .batches import Accepted, BatchBuilder, default_convert
from .config import RolloutConfig
from .controller import RolloutController
from .data_source import DataSource
from .environments import Composition, EnvironmentMix, MixState
from .generation import GenerationClient, Returned
from .online_gc import OnlineGC, OnlineGCFailed
from .replay import Replay, ReplayGroup, ReplayPlan, plan_replay, replay_archives
from .samples import Sample, SampleGroup, Stage, Status
from .scheduling import StalenessBound, StalenessPolicy, staleness
from .shards import RankBatchRef, RankShard

# the layer's interface; everything else is imported from its module
__all__ = [
    "RolloutConfig", "RolloutController", "GenerationClient", "Returned",
    "Sample", "SampleGroup", "Stage", "Status",
    "StalenessBound", "StalenessPolicy", "staleness",
    "DataSource", "EnvironmentMix", "MixState", "Composition",
    "BatchBuilder", "Accepted", "default_convert", "RankBatchRef", "RankShard",
    "OnlineGC", "OnlineGCFailed",
    "RolloutArchive", "ReplayPlan", "ReplayGroup", "plan_replay", "Replay", "replay_archives",
]
