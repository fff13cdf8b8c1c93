"""Every public call of straw-queue 0.1.6 takes its arguments as straw-queue's callers pass
them: each positional parameter at its position and by its name, each keyword parameter
by its name, and no extra required parameter.  The table is straw-queue's public surface
(names and parameter names, read from its documentation and sources); where a call is
not served its absence is in docs/COMPATIBILITY.md (``discover``: our layout differs;
``stop_remote_worker``: no SSH hosts).  straw.journal is internal in both and
``straw.tracing`` is covered by tests/compat/test_peripheral.py."""

from __future__ import annotations

import importlib
import inspect

import pytest

# (qualified name under straw, positional parameters, keyword-only parameters); a class
# name alone is its constructor
SURFACE = [
    ('backend.FilesystemBackend', ['root'], ['profile', 'declaration', 'fault']),
    ('backend.FilesystemBackend.path', ['relative'], []),
    ('backend.FilesystemBackend.sync_directory', ['path'], []),
    ('backend.FilesystemBackend.open_committed', ['relative'], []),
    ('backend.FilesystemBackend.diagnostics', [], []),
    ('benchmark.percentile', ['values', 'q'], []),
    ('benchmark.completion_peak', ['events', 'window'], ['checked']),
    ('benchmark.profile', ['args'], []),
    ('benchmark.load_sizes', ['args'], []),
    ('benchmark.worker', ['args'], []),
    ('benchmark.run', ['args'], []),
    ('benchmark.main', [], []),
    ('coordinator.Coordinator', ['store'], ['queue_id', 'namespace', 'exclusive_owner', 'recover', 'limits', 'lease_seconds', 'clock']),
    ('coordinator.Coordinator.close', [], []),
    ('coordinator.Coordinator.submit_tasks', ['request_id', 'tasks'], ['producer_id', 'producer_state']),
    ('coordinator.Coordinator.producer_state', ['producer_id'], []),
    ('coordinator.Coordinator.acquire', ['worker_id', 'max_tasks'], ['task_ids', 'task_prefix', 'control']),
    ('coordinator.Coordinator.save_task_progress_many', ['updates'], ['request_id']),
    ('coordinator.Coordinator.yield_tasks', ['updates'], ['request_id']),
    ('coordinator.Coordinator.pending_tasks', [], ['task_prefix', 'min_priority']),
    ('coordinator.Coordinator.release_tasks', ['leases'], ['request_id']),
    ('coordinator.Coordinator.release_task_reads', ['leases'], []),
    ('coordinator.Coordinator.heartbeat', ['leases'], []),
    ('coordinator.Coordinator.complete_task', ['lease'], ['submission_id', 'result_ref', 'result_digest']),
    ('coordinator.Coordinator.fail_task', ['lease'], ['request_id', 'failure', 'retryable']),
    ('coordinator.Coordinator.yield_task', ['lease'], ['request_id', 'input_ref']),
    ('coordinator.Coordinator.save_task_progress', ['lease'], ['request_id', 'input_ref']),
    ('coordinator.Coordinator.cancel_task', ['task_id'], ['request_id']),
    ('coordinator.Coordinator.seal_input', ['request_id'], []),
    ('coordinator.Coordinator.lookup_submission', ['submission_id'], []),
    ('coordinator.Coordinator.read_commits', ['cursor', 'limit'], []),
    ('coordinator.Coordinator.retire_worker', ['worker_id'], []),
    ('coordinator.Coordinator.outstanding_reads', [], []),
    ('coordinator.Coordinator.task_status', ['task_id'], []),
    ('coordinator.Coordinator.open_consumer', ['consumer_id'], ['exclusive_owner']),
    ('coordinator.Coordinator.close_consumer', ['consumer_id', 'token'], []),
    ('coordinator.Coordinator.save_consumer_state', ['consumer_id'], ['token', 'request_id', 'state_ref', 'fetch_cursor', 'processed_cursor', 'progress_ref']),
    ('coordinator.Coordinator.load_consumer_state', ['consumer_id'], []),
    ('coordinator.Coordinator.plan_batch', ['consumer_id'], ['token', 'batch_id', 'input_positions', 'plan_ref']),
    ('coordinator.Coordinator.batch_ready', ['consumer_id'], ['token', 'batch_id', 'ready_ref', 'state_ref', 'fetch_cursor', 'processed_cursor', 'progress_ref']),
    ('coordinator.Coordinator.get_batch', ['batch_id'], []),
    ('coordinator.Coordinator.register_checkpoint', ['checkpoint_id', 'checkpoint_ref'], []),
    ('coordinator.Coordinator.release_checkpoint', ['checkpoint_id'], []),
    ('coordinator.Coordinator.collect_garbage', [], []),
    ('coordinator.Coordinator.snapshot', [], []),
    ('coordinator.Coordinator.metrics', [], []),
    ('coordinator.Coordinator.drain', [], []),
    ('inspect.inspect_run', ['root'], []),
    ('inspect.cleanup_orphans', ['root', 'report'], ['all_participants_stopped']),
    ('inspect.main', [], []),
    ('protocol.encode', ['value'], []),
    ('protocol.decode', ['value'], []),
    ('protocol.digest', ['value'], []),
    ('protocol.bounded_metadata', ['value', 'limit'], []),
    ('protocol.RecordRef.from_dict', ['value'], []),
    ('protocol.RecordSetRef.from_dict', ['value'], []),
    ('protocol.TaskSpec.from_dict', ['value'], []),
    ('protocol.CommitReceipt.from_dict', ['value'], []),
    ('reporting.write_report', ['path', 'value'], []),
    ('rpc.serve', ['coordinator', 'address'], ['token', 'ready']),
    ('rpc.QueueClient', ['address'], ['token', 'timeout', 'metadata_bytes']),
    ('rpc.QueueClient.call', ['method'], []),
    ('store.ReadSession.read_record', ['ref'], []),
    ('store.ReadSession.manifest', ['ref'], []),
    ('store.ReadSession.validate', ['ref'], ['task_id', 'attempt_id']),
    ('store.ReadSession.read', ['ref'], []),
    ('store.ReadSession.read_tensor_range', ['ref', 'start', 'stop'], ['expected']),
    ('store.ReadSession.envelope', ['ref'], []),
    ('store.ReadSession.close', [], []),
    ('store.SharedFilesystemStore', ['root', 'run_id'], ['backend', 'codecs', 'max_record_bytes', 'max_buffer_bytes', 'segment_target_bytes', 'online_gc']),
    ('store.SharedFilesystemStore.close', [], []),
    ('store.SharedFilesystemStore.seal', [], []),
    ('store.SharedFilesystemStore.retire_writer', ['writer_id'], ['policy']),
    ('store.SharedFilesystemStore.publication_receipt', ['writer_id'], ['api', 'submission_id']),
    ('store.SharedFilesystemStore.retain', ['owner', 'refs'], []),
    ('store.SharedFilesystemStore.release', ['owner'], []),
    ('store.SharedFilesystemStore.release_publications', ['refs'], []),
    ('store.SharedFilesystemStore.pin', ['refs'], ['owner']),
    ('store.SharedFilesystemStore.collect_garbage', [], []),
    ('store.SharedFilesystemStore.write_records', ['records'], ['submission_id']),
    ('store.SharedFilesystemStore.publish', ['records'], ['submission_id', 'dependencies']),
    ('store.SharedFilesystemStore.publish_many', ['publications'], ['submission_id']),
    ('store.SharedFilesystemStore.inspect_segment', ['ref'], ['verify_payload']),
    ('store.SharedFilesystemStore.read_range', ['ref', 'start', 'stop'], ['chunk_bytes', 'checksums']),
    ('store.SharedFilesystemStore.read_tensor_range', ['ref', 'start', 'stop'], ['expected']),
    ('store.SharedFilesystemStore.read_session', [], []),
    ('store.SharedFilesystemStore.read', ['ref'], []),
    ('store.SharedFilesystemStore.record_set', ['refs'], ['submission_id', 'dependencies']),
    ('tensor.tensor_record', ['value', 'identity'], ['kind']),
    ('tensor.release_tensor_publications', ['store', 'tensors'], []),
    ('tensor.TensorRef.shares_storage', ['store'], []),
    ('tensor.TensorRef.share', ['store'], ['submission_id']),
    ('tensor.TensorRef.from_record_set', ['store', 'reference', 'ordinal'], ['validated']),
    ('tensor.TensorRef.from_record_set_many', ['store', 'reference'], ['validated', 'reader']),
    ('tensor.TensorRef.from_record', ['store', 'reference'], ['blob_set', 'ordinal', 'validated']),
    ('tensor.TensorRef.updated', ['store', 'values'], ['submission_id', 'rows']),
    ('tensor.TensorRef.validate', [], []),
    ('tensor.TensorRef.load', [], ['pin_memory', 'reader']),
    ('tensor.TensorRef.link', ['path'], []),
    ('tensor.publish_tensors', ['store', 'tensors'], ['submission_id', 'record_prefix']),
]


def _resolve(qualname: str):  # type: ignore[no-untyped-def]
    parts = qualname.split(".")
    # the longest importable prefix is the module, the rest are attributes
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module("straw." + ".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    obj = importlib.import_module("straw")
    for name in parts:
        obj = getattr(obj, name)
    return obj


def _parameters(obj) -> list[inspect.Parameter]:  # type: ignore[no-untyped-def]
    params = list(inspect.signature(obj).parameters.values())
    if inspect.isfunction(obj) and params and params[0].name in ("self", "cls"):
        params = params[1:]  # a method looked up on its class
    return params


@pytest.mark.parametrize(("qualname", "positional", "keywords"), SURFACE,
                         ids=[row[0] for row in SURFACE])
def test_call_takes_straw_queue_arguments(qualname, positional, keywords):
    params = _parameters(_resolve(qualname))
    by_name = {p.name: p for p in params}
    takes_any_keyword = any(p.kind is p.VAR_KEYWORD for p in params)
    ordered = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    for index, name in enumerate(positional):
        assert name in by_name or takes_any_keyword, f"{qualname}: no parameter {name!r}"
        if name in by_name:
            assert index < len(ordered) and ordered[index].name == name, (
                f"{qualname}: {name!r} is not positional parameter {index}")
    for name in keywords:
        assert name in by_name or takes_any_keyword, f"{qualname}: no keyword {name!r}"
        if name in by_name:
            assert by_name[name].kind in (inspect.Parameter.KEYWORD_ONLY,
                                          inspect.Parameter.POSITIONAL_OR_KEYWORD)
    theirs = set(positional) | set(keywords)
    extra = [p.name for p in params if p.default is inspect.Parameter.empty
             and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in theirs]
    assert not extra, f"{qualname}: requires {extra}, which straw-queue callers never pass"


def test_tensor_limits_keep_straw_queue_names_and_values():
    from straw import tensor
    assert tensor.MAX_TENSOR_BYTES == 16 * 1024**3
    assert tensor.MAX_PUBLICATION_BYTES == 16 * 1024**2


def test_values_and_messages_a_straw_queue_caller_relies_on(tmp_path):
    import dataclasses

    from straw import Coordinator, Limits, Publication, Record, SharedFilesystemStore
    from straw.errors import CorruptData, ResourceLimitExceeded
    from straw.protocol import bounded_metadata, decode, encode

    # straw-queue's defaults for its own fields; ours keep theirs
    assert (Limits().pending_tasks, Limits().inflight_tasks, Limits().control_tasks) == (
        10_000, 256, 1)
    for f in dataclasses.fields(Limits):
        if f.name != "max_unconsumed_results":
            with pytest.raises(ValueError, match=f"^Queue limits must be positive: Limits.{f.name}"):
                Limits(**{f.name: 0})
    with pytest.raises(CorruptData, match="^Invalid JSON metadata"):
        decode(b"{not json")
    big = {"k": "v" * 100}
    assert bounded_metadata(big, 8) == encode(big)  # straw-queue ignores the limit
    with pytest.raises(ResourceLimitExceeded):
        bounded_metadata(big, 8, enforce=True)
    with SharedFilesystemStore(tmp_path, "values") as store:
        ref = store.publish([Record("a", b"x")], submission_id="a")
        assert isinstance(store.publish_many([Publication([])], submission_id="none"),
                          tuple)
        with store.read_session() as reader:
            assert reader.backend is store.backend and reader.run_id == "values"
            assert reader.read_record(ref=store.validate(ref)[0]).payload == b"x"
        assert store.inspect_segment(ref=ref.manifest.segment)["run_id"] == "values"
        with Coordinator(store) as queue:
            assert isinstance(queue.clock(), float)
