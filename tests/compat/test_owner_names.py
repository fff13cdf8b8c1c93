"""Owner names: every name a straw-queue 0.1.6 caller can retain under works here too.

straw-queue refuses only ``queue:`` and ``publication:`` (its internal owners); callers
name checkpoints ``checkpoint:<step>``, pins ``pin:<reader>`` and so on.  straw keeps its
own owners under those two prefixes, so the caller's names never meet ours."""

from __future__ import annotations

import pytest

from straw import Coordinator, Record, SharedFilesystemStore, TaskSpec


def _sealed(store: SharedFilesystemStore, name: str):
    ref = store.publish([Record(name, name.encode() * 50)], submission_id=name)
    store.seal()
    store.release_publications([ref])  # unstaged: only its owner keeps it now
    return ref


@pytest.mark.parametrize("owner", ["checkpoint:7", "pin:reader-3", "staged:x", "reader:1",
                                   "queue", "publication", "\u00e9t\u00e9 2"])
def test_a_straw_queue_owner_name_retains_and_releases(tmp_path, owner):
    with SharedFilesystemStore(tmp_path, "run") as store:
        ref = _sealed(store, "a")
        store.retain(owner, [ref])
        assert owner in store.owners()
        assert store.collect_garbage()["reclaimed_files"] == 0
        assert next(store.read(ref)).payload == b"a" * 50
        assert store.release(owner) is True
        assert store.collect_garbage()["reclaimed_files"] == 1


def test_a_named_pin_with_a_pin_prefix_holds_for_its_block(tmp_path):
    with SharedFilesystemStore(tmp_path, "run") as store:
        ref = _sealed(store, "a")
        with store.pin([ref], owner="pin:trainer-0"):
            assert store.owners() == ["pin:trainer-0"]
            assert store.collect_garbage()["reclaimed_files"] == 0
        assert store.owners() == []
        assert store.collect_garbage()["reclaimed_files"] == 1


def test_an_unnamed_pin_is_named_where_no_caller_can_name_an_owner(tmp_path):
    with SharedFilesystemStore(tmp_path, "run") as store:
        ref = _sealed(store, "a")
        store.retain("pin:mine", [ref])
        with store.pin([ref]) as pin:
            assert pin.owner.startswith("publication:pin:")
            assert set(store.owners()) == {"pin:mine", pin.owner}
            with pytest.raises(ValueError, match="reserved"):
                store.retain(pin.owner, [ref])
        # the block's end released its own pin only, not the caller's "pin:" owner
        assert store.owners() == ["pin:mine"]


def test_an_unnamed_pin_left_by_a_dead_reader_can_be_released(tmp_path):
    with SharedFilesystemStore(tmp_path, "run") as store:
        ref = _sealed(store, "a")
        pin = store.pin([ref])
        pin.__enter__()  # the reader dies inside its block: nobody leaves it
        left = pin.owner
    with SharedFilesystemStore(tmp_path, "run") as operator:
        assert operator.owners() == [left]
        assert operator.collect_garbage()["reclaimed_files"] == 0
        assert operator.release(left) is True
        assert operator.collect_garbage()["reclaimed_files"] == 1


def test_straw_queues_reserved_prefixes_are_refused_here_too(tmp_path):
    with SharedFilesystemStore(tmp_path, "run") as store:
        ref = _sealed(store, "a")
        for owner in ("queue:rollout", "publication:w:1"):
            with pytest.raises(ValueError, match="reserved"):
                store.retain(owner, [ref])
            with pytest.raises(ValueError, match="reserved"):
                store.pin([ref], owner=owner)


def test_a_checkpoint_owner_and_a_queue_owner_keep_their_own_roots(tmp_path):
    with SharedFilesystemStore(tmp_path, "run") as store:
        prompt = _sealed(store, "prompt")
        q = Coordinator(store, queue_id="rollout", exclusive_owner="test")
        q.submit_tasks("r1", [TaskSpec("t1", prompt)])
        store.retain("checkpoint:1", [prompt])
        (queue_owner,) = [o for o in store.owners() if o.startswith("queue:")]
        assert set(store.owners()) == {queue_owner, "checkpoint:1"}
        with pytest.raises(ValueError, match="belongs to straw"):
            store.release(queue_owner)
        assert store.release("checkpoint:1") is True
        # the queue still holds the task's input
        assert store.collect_garbage()["reclaimed_files"] == 0
        q.close()
