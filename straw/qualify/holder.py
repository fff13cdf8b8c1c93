"""A lock holder in its own process, for ``lock_release_on_death``: it takes the flock of
one file, says so on stdout, and waits to be SIGKILLed (the filesystem must then release
the lock: a dead coordinator or writer must never block recovery).

    python -m straw.qualify.holder PATH
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from ..fs import PosixFS


class ProcessHolder:
    """Starts the holder process and returns once it holds the lock of ``path``."""

    def __init__(self, path: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "straw.qualify.holder", path],
                                     stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # bounded: the child exits if it cannot lock
        if line.strip() != b"locked":
            self.close()
            raise RuntimeError(f"the lock holder process could not lock {path}: {line!r}")

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def main(path: str) -> int:
    fs = PosixFS()
    fd = fs.open(path, write=True)
    if not fs.lock(fd, blocking=False):
        print("busy", flush=True)
        return 1
    print("locked", flush=True)
    signal.pause()  # until SIGKILL
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
