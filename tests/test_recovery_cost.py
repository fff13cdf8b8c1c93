"""What a queue's recovery reads (issue 13: an open costs the live state, not the history).

After a long job most of a queue's history is the results of its completed tasks, kept in
history segments (``straw.history``) until the designated consumer retires them.  A fresh
coordinator that recovers the queue must not read them: the staging of what the recovered
journal names is dropped at the next collection (as the previous coordinator would have),
and that collection looks the results up.  Recovery itself reads no history segment."""

from __future__ import annotations

from typing import Any

from straw import Coordinator, Record, SharedFilesystemStore, TaskSpec
from straw.fs import PosixFS
from straw.fs_delegating import DelegatingFilesystem


class _Watch(DelegatingFilesystem):
    """Records every file opened under a queue's ``history/`` directory."""

    def __init__(self) -> None:
        super().__init__(PosixFS())
        self.history_opens: list[str] = []

    def open(self, path: str, *, write: bool = False, create: bool = False,
             exclusive: bool = False) -> int:
        if "/history/" in path:
            self.history_opens.append(path)
        return self.inner.open(path, write=write, create=create, exclusive=exclusive)

    def open_beneath(self, root: str, rel: str) -> int:
        if rel.startswith("history/"):
            self.history_opens.append(f"{root}/{rel}")
        return self.inner.open_beneath(root, rel)


def _staged(store: SharedFilesystemStore, ref: Any) -> bool:
    with store.catalog.locked() as st:
        info = st.packs[ref.path]
        return ref.offset not in info.unstaged


def test_recovery_reads_no_history_and_the_next_collection_drops_the_staging(tmp_path):
    root = str(tmp_path)
    with SharedFilesystemStore(root, "run", writer_id="w") as store:
        q = Coordinator(store, queue_id="q", snapshot_every=5)
        q.submit_tasks("r", [TaskSpec(f"t{i}") for i in range(40)])
        results = []
        for _ in range(40):
            lease = q.acquire("w").assignments[0].lease
            ref = store.publish([Record("out", b"r" * 64, metadata={
                "task_id": lease.task_id, "attempt_id": lease.attempt_id})],
                submission_id=f"out-{lease.task_id}")
            q.complete_task(lease, submission_id=f"done-{lease.task_id}", result_ref=ref)
            results.append(ref)
        q.close()  # stopped before any collection: the results are still staged
        store.seal()
        assert len(q.state.commits) == 40 and q.state.commits._base >= 30  # in history
    watch = _Watch()
    with SharedFilesystemStore(root, "run", writer_id="w2", fs=watch) as store:
        assert all(_staged(store, r) for r in results)
        q = Coordinator(store, queue_id="q", recover=True)
        assert q.state.commits._base >= 30
        assert watch.history_opens == []  # the open read no history segment
        q.collect_garbage()
        assert watch.history_opens  # the collection looked the results up
        # their staging is gone (the journal names them, D2); the queue keeps them
        assert not any(_staged(store, r) for r in results)
        assert all(next(store.read(r)).payload == b"r" * 64 for r in results)
        assert q.task_status("t3")["state"] == "completed"
        q.close()


def test_a_recovery_replays_at_most_a_few_thousand_transactions_by_default(tmp_path):
    """The journal suffix a fresh open replays is bounded by the coordinator's default
    snapshot cadence (about 30 us of CPU per transaction: 20,000 of them made an open of a
    million-task pool cost ~0.5 s of CPU, 5,000 about 0.15 s)."""
    import threading

    from straw import journal as journal_mod

    root = str(tmp_path)
    calls, threads = 5_200, 16
    with SharedFilesystemStore(root, "run", writer_id="w") as store:
        q = Coordinator(store, queue_id="q")  # the default cadence

        def submit(part: int) -> None:  # one transaction per call; threads share syncs
            for i in range(part, calls, threads):
                q.submit_tasks(f"r{i}", [TaskSpec(f"t{i}")])

        ts = [threading.Thread(target=submit, args=(k,)) for k in range(threads)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert len(q.state.tasks) == calls
        journal_dir = q.journal_dir
        q.close()
        got = journal_mod.recover(store.fs, journal_dir)
        assert got.snapshot is not None
        assert len(got.transactions) <= 5_000 + threads  # (in flight while it snapshotted)
