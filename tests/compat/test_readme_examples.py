"""The user guide's examples (docs/store.md, queue.md, rollout.md, checkpoints.md and
archives.md, which the README points to) run as written (in straw-queue's vocabulary), one
after the other in one namespace and in this process, on pools in a temp directory.  tests/test_docs_examples.py runs every example of the guide alone in a
subprocess as well."""

from __future__ import annotations

import os
import re
import tempfile

import pytest

DOCS = os.path.join(os.path.dirname(__file__), "..", "..", "docs")
GUIDE = ("store.md", "queue.md", "rollout.md", "checkpoints.md", "archives.md")


def test_readme_examples_run(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    blocks = []
    for name in GUIDE:
        text = open(os.path.join(DOCS, name), encoding="utf-8").read()
        blocks += [(name, b) for b in re.findall(r"```python\n(.*?)```", text, re.S)]
    assert len(blocks) >= 4
    # the rollout layer's debug-archive example is one of them
    assert any("RolloutArchive.save(" in b and "export_pt(" in b for _, b in blocks)
    first = blocks[0][1]
    assert "with SharedFilesystemStore(" in first, "the first example opens its store in a with block"
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the examples' mkdtemp() pools
    namespace: dict[str, object] = {}
    for n, (name, block) in enumerate(blocks):
        exec(compile(block, f"docs/{name}[{n}]", "exec"), namespace)
