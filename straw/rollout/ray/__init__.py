"""straw.rollout.ray: the distributed fully async rollout on a Ray cluster (issue 17), the
only part of straw that imports Ray (``pip install straw[ray]``).

* ``job``     ``RayRollout``: the controller actor on the driver's node, a generation actor
              per node sharing the job's concurrency, the start-up storage probe, the
              admission pause (``pause``/``resume``) and the batches;
* ``actors``  the actors as plain classes: ``ControllerWorker`` (the ``RolloutController``
              and the ``BatchBuilder``), ``GenerationWorker`` (a node's ``GenerationClient``
              and ``Producer``), ``RayController`` (the controller as a client calls it);
* ``local``   a local cluster started once by a supervisor and joined by drivers (the demo).

Ray carries only control messages (leases, references, receipts: each well under 1 KiB);
payloads travel through the shared pool.  The generate function is the framework-neutral
protocol of ``straw.rollout.generate``; the slots that run it are ``straw.rollout.producer``.
"""

from __future__ import annotations

from .actors import ControllerWorker, GenerationWorker, StorageProbeFailed
from .client import ControllerLost, RayController, controller_state
from .job import NodeSpec, RayRollout, Worker, default_nodes, share_concurrency

__all__ = ["RayRollout", "NodeSpec", "Worker", "share_concurrency", "default_nodes",
           "ControllerWorker", "GenerationWorker", "RayController", "ControllerLost",
           "StorageProbeFailed", "controller_state"]
