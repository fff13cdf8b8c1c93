"""A local Ray cluster for a job that runs on one machine (the demo, small experiments):
started once by a supervising process, joined by the job's driver processes, so that a
driver can die (SIGKILL) and a new one join the same cluster without Ray starting again.

``start_local(num_cpus)`` starts it (``ray.init``: this process is a driver too) with the
directory holding ``straw`` on every worker's ``PYTHONPATH`` (the actors import this
checkout, whatever is installed), and returns its address; ``connect(address)`` joins it;
``node_id()`` is this driver's node; ``shutdown()`` stops it (or leaves it).
"""

from __future__ import annotations

import os

import ray

import straw


def _with_straw_on_path() -> None:
    here = os.path.dirname(os.path.dirname(os.path.abspath(straw.__file__)))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if here not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([here, *paths])


def start_local(num_cpus: int) -> str:
    """Start a local Ray cluster of ``num_cpus`` CPUs (no dashboard, workers' output not
    forwarded) and return its address."""
    _with_straw_on_path()
    # address="local": a new cluster of our own, even when another one runs on this machine
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
             log_to_driver=False)
    return str(ray.get_runtime_context().gcs_address)


def connect(address: str) -> None:
    """Join the cluster at ``address`` as a driver."""
    _with_straw_on_path()
    ray.init(address=address, log_to_driver=False)


def node_id() -> str:
    return str(ray.get_runtime_context().get_node_id())


def shutdown() -> None:
    ray.shutdown()


__all__ = ["start_local", "connect", "node_id", "shutdown"]
