"""The README's "Using it" examples run as written (in straw-queue's vocabulary), one after
the other in one namespace, on a pool in a temp directory instead of /shared/job-17."""

from __future__ import annotations

import os
import re
import textwrap

import pytest

README = os.path.join(os.path.dirname(__file__), "..", "..", "README.md")


def test_readme_examples_run(tmp_path):
    pytest.importorskip("torch")
    text = open(README, encoding="utf-8").read()
    text = text[text.index("## Using it"):text.index("## What straw guarantees")]
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 4
    # the rollout section's debug-archive example is one of them (issue 16)
    assert "#### Debug archives" in text
    assert any("RolloutArchive.save(" in b and "export_pt(" in b for b in blocks)
    first = blocks[0].splitlines()
    opener = [i for i, line in enumerate(first) if line.startswith("with SharedFilesystemStore(")]
    assert opener, "the first example opens its store in a with block"
    i = opener[0]
    # the with block's body, dedented, against a store that stays open for the next blocks
    store = f"store = SharedFilesystemStore({str(tmp_path)!r}, 'job-17', online_gc=True)\n"
    code = "\n".join(first[:i]) + "\n" + store + textwrap.dedent("\n".join(first[i + 1:]))
    namespace: dict[str, object] = {}
    exec(compile(code, "README.md[0]", "exec"), namespace)
    for n, block in enumerate(blocks[1:], 1):
        exec(compile(block, f"README.md[{n}]", "exec"), namespace)
    namespace["store"].close()  # type: ignore[attr-defined]
