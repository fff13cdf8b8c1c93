"""``AckLog``: a tiny append-only log of JSON entries, one framed and fsynced entry each.

Used to record what a writer was told was durable (acknowledgement logs of the demo, the
crash campaigns and the fuzz harness), so a checker can later verify every acknowledged
reference.  Single writer per file; any number of readers.  A torn final entry (the
writer was killed mid-append) is ignored by ``read``.
"""

from __future__ import annotations

import json
from typing import Any

from .durable import framing
from .fs import Filesystem


class AckLog:
    def __init__(self, fs: Filesystem, path: str) -> None:
        self.fs = fs
        self.path = path
        self._fd: int | None = None
        self._end = 0

    def append(self, entry: Any) -> None:
        """Append one entry and make it durable before returning."""
        if self._fd is None:
            self._fd = self.fs.open(self.path, write=True, create=True)
            self._end = framing.scan_frames(framing.read_at_fn(self.fs, self._fd),
                                            self.fs.fstat(self._fd).size).end
        body = json.dumps(entry, sort_keys=True).encode()
        frame = framing.encode_frame(framing.KIND_LOG, body, group_start=self._end)
        self.fs.writev(self._fd, [frame], self._end)
        self.fs.fsync(self._fd)
        self._end += len(frame)

    def read(self) -> list[Any]:
        try:
            fd = self.fs.open(self.path)
        except FileNotFoundError:
            return []
        try:
            scan = framing.scan_frames(framing.read_at_fn(self.fs, fd), self.fs.fstat(fd).size)
        finally:
            self.fs.close(fd)
        return [json.loads(f.body) for f in scan.frames if f.header.kind == framing.KIND_LOG]

    def close(self) -> None:
        if self._fd is not None:
            self.fs.close(self._fd)
            self._fd = None
