"""``validate`` (and what calls it: a consumer rewinding to a checkpoint verifies every
result it makes reachable again) checks every payload byte without holding the payload:
a 64 MiB result is verified by a process with 32 MiB of address space to spare, as
straw-queue's is; a flipped byte in it is still ``CorruptData``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import straw
from straw import Record, SharedFilesystemStore
from straw.errors import CorruptData

SIZE = 64 * 1024**2

# A fresh interpreter (so the limit counts only what validate allocates) that imports
# this tree's straw, caps its address space at its size plus 32 MiB, then validates.
SCRIPT = """
import json, resource, sys
sys.path.insert(0, sys.argv[1])
from straw import SharedFilesystemStore
from straw.protocol import RecordSetRef
store = SharedFilesystemStore(sys.argv[2], 'big')
ref = RecordSetRef.from_dict(json.loads(sys.argv[3]))
store.validate(ref)  # warm: imports, the descriptor, the manifest cache
status = open('/proc/self/status').read().splitlines()
size = int(next(line.split()[1] for line in status if line.startswith('VmSize:'))) * 1024
resource.setrlimit(resource.RLIMIT_AS, (size + 32 * 1024**2, size + 32 * 1024**2))
for _ in range(3):
    store.validate(ref)
print('validated')
"""


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/status")
def test_validate_checks_a_large_payload_in_bounded_memory(tmp_path):
    import dataclasses
    import json

    with SharedFilesystemStore(tmp_path, "big") as store:
        ref = store.publish([Record("big", b"x" * SIZE)], submission_id="big")
    tree = str(Path(straw.__file__).resolve().parent.parent)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, tree, str(tmp_path),
         json.dumps(dataclasses.asdict(ref))],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "validated" in done.stdout, done.stderr
    # the bounded path still checks every byte: one flipped byte deep in the payload
    pack = tmp_path / ref.manifest.segment.path
    at = ref.manifest.segment.offset + ref.manifest.segment.size // 2
    with pack.open("r+b") as f:
        f.seek(at)
        f.write(b"y")
    with SharedFilesystemStore(tmp_path, "big") as store:
        with pytest.raises(CorruptData, match="checksum"):
            store.validate(ref)
