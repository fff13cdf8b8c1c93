"""Benchmarks of straw against the machine's own limits and against straw-queue.

Run from the repository root: ``python -m bench.bench`` (``just bench``) and
``python -m bench.peer`` (``just bench-peer``).  Benchmarks, never timed tests.
"""
