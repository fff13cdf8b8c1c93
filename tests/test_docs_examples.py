"""Every example of the guide runs, and every relative link of the guide resolves.

The guide is ``README.md`` and ``docs/*.md``.  Each fenced ```` ```python ```` block there is
run on its own: in a subprocess (``sys.executable``, the repository on ``PYTHONPATH``), with
a fresh temporary directory as its working directory and as ``TMPDIR`` (so
``tempfile.mkdtemp()`` pools land there and are removed afterwards), under a timeout.  The
block is compiled with the Markdown file as its file name and its own line numbers, so a
failure names the file and line that raised (``docs/store.md:42``) and the traceback shows
the Markdown line itself.

Conventions for the guide's authors:

* Make a ``python`` example self-contained (its imports, a pool in ``tempfile.mkdtemp()``,
  small data): it runs exactly as a reader would paste it.
* Output listings and shell sessions use another fence language (``text``, ``console``,
  ``sh``, ``bash``): they are not run.
* A ``python`` block that cannot run here (it needs a mounted JuiceFS volume, a cluster, a
  GPU) starts with the line ``# not run: <reason>``.  Keep these rare: ``MAX_NOT_RUN``
  bounds how many there are.
* A block that imports an optional dependency that is not installed (``torch``, ``ray``,
  ...) is skipped, saying which.  Ray blocks run a local Ray instance and must finish within
  ``TIMEOUT`` like any other.

Links: every relative link target (``[text](path)``, ``[text](path#anchor)``,
``[text](#anchor)``) of those files must exist, and an anchor into a Markdown file must name
one of its headings (GitHub's slugs).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT = 90.0  # seconds per block (the Ray example takes ~20 s on 2 cores)
MAX_NOT_RUN = 2  # python blocks marked "# not run: <reason>" across the whole guide
NOT_RUN = re.compile(r"#\s*not run:\s*(?P<reason>\S.*)")
OPTIONAL = ("torch", "ray", "matplotlib", "rich")  # extras a block may need


def guide() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclasses.dataclass(frozen=True)
class Block:
    path: Path
    line: int  # the first line of code (1-based), just after the opening fence
    lang: str
    code: str
    end: int = 0  # the closing fence's line

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def not_run(self) -> str | None:
        first = self.code.lstrip("\n").split("\n", 1)[0].strip()
        m = NOT_RUN.fullmatch(first)
        return m["reason"] if m else None


FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})\s*(?P<info>[^`]*)$")


def fenced_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file (CommonMark's rules, enough of them)."""
    blocks: list[Block] = []
    lines = path.read_text(encoding="utf-8").split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang = m["fence"], (m["info"].split() or [""])[0].lower()
        start, i = i + 1, i + 1
        while i < len(lines):
            close = FENCE.match(lines[i])
            if close and close["fence"][0] == fence[0] and len(close["fence"]) >= len(fence) \
                    and not close["info"].strip():
                break
            i += 1
        else:
            raise AssertionError(f"{path.relative_to(ROOT)}:{start}: unclosed code fence")
        blocks.append(Block(path, start + 1, lang, "\n".join(lines[start:i]) + "\n", i + 1))
        i += 1
    return blocks


def python_blocks() -> list[Block]:
    return [b for p in guide() for b in fenced_blocks(p) if b.lang in ("python", "py")]


RUNNABLE = [b for b in python_blocks() if b.not_run is None]

# Runs one block as __main__ (so that functions and classes it defines pickle, for Ray),
# compiled under the Markdown file's name with the block's own line numbers.
RUNNER = """\
import sys, __main__
path, line = sys.argv[1], int(sys.argv[2])
code = sys.stdin.read()
exec(compile("\\n" * (line - 1) + code, path, "exec"), __main__.__dict__)
"""


def imported_modules(code: str) -> set[str]:
    names = set()
    for m in re.finditer(r"^\s*(?:from\s+([\w.]+)\s+import|import\s+([\w., ]+))", code, re.M):
        if m[1]:
            names.add(m[1].split(".")[0])
        else:
            names.update(n.strip().split(".")[0].split()[0] for n in m[2].split(",") if n.strip())
    return names


def run_block(block: Block) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="strawdoc-", ignore_cleanup_errors=True) as tmp:
        env = {**os.environ, "TMPDIR": tmp, "PYTHONDONTWRITEBYTECODE": "1",
               "PYTHONPATH": os.pathsep.join(
                   [str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH")
                                  else []))}
        proc = subprocess.Popen([sys.executable, "-c", RUNNER, str(block.path), str(block.line)],
                                cwd=tmp, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = proc.communicate(block.code, timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the block's process group (Ray's too)
            out, err = proc.communicate()
            pytest.fail(f"{block.where}: the example did not finish within {TIMEOUT:.0f} s\n"
                        f"{err[-4000:]}")
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.parametrize("block", RUNNABLE, ids=[b.where for b in RUNNABLE])
def test_python_example_runs(block: Block) -> None:
    missing = sorted(m for m in imported_modules(block.code) & set(OPTIONAL)
                     if importlib.util.find_spec(m) is None)
    if missing:
        pytest.skip(f"{block.where} needs {', '.join(missing)} (not installed)")
    done = run_block(block)
    if done.returncode != 0:
        pytest.fail(failure(block, done), pytrace=False)


def failure(block: Block, done: subprocess.CompletedProcess[str]) -> str:
    # the innermost frame in the Markdown file: the line of the example that raised
    lines = re.findall(rf'File "{re.escape(str(block.path))}", line (\d+)', done.stderr)
    at = f"{block.path.relative_to(ROOT)}:{lines[-1]}" if lines else block.where
    return (f"{at}: the example starting at {block.where} raised (exit status "
            f"{done.returncode}):\n{done.stderr[-6000:]}")


def test_a_failing_example_is_reported_at_its_line() -> None:
    block = Block(ROOT / "docs" / "store.md", 40, "python", "x = 1\nraise ValueError(x)\n", 43)
    done = run_block(block)
    assert done.returncode != 0 and "ValueError: 1" in done.stderr
    assert failure(block, done).startswith(
        "docs/store.md:41: the example starting at docs/store.md:40 raised")


def test_the_guide_has_examples_and_few_exceptions() -> None:
    blocks = python_blocks()
    assert len(RUNNABLE) >= 9, [b.where for b in RUNNABLE]
    not_run = [b for b in blocks if b.not_run is not None]
    assert len(not_run) <= MAX_NOT_RUN, (
        "keep examples runnable; blocks marked not run: "
        + ", ".join(f"{b.where} ({b.not_run})" for b in not_run))
    assert any(b.path.name == "README.md" for b in RUNNABLE), "the README's example runs"


def test_the_extractor_and_the_marker() -> None:
    doc = ("text\n```python\nx = 1\n```\n\n````markdown\n```python\nnot = a block\n```\n````\n"
           "~~~py\n# not run: needs a JuiceFS mount\nfrom straw import x\n~~~\n")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "doc.md"
        path.write_text(doc, encoding="utf-8")
        blocks = fenced_blocks(path)
    assert [(b.line, b.end, b.lang) for b in blocks] == [
        (3, 4, "python"), (7, 10, "markdown"), (12, 14, "py")]
    assert blocks[0].code == "x = 1\n" and blocks[0].not_run is None
    assert blocks[2].not_run == "needs a JuiceFS mount"
    assert imported_modules("import numpy as np, torch\nfrom ray.util import x\n") == {
        "numpy", "torch", "ray"}


# --- links -----------------------------------------------------------------------------

LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def fenced_lines(path: Path) -> set[int]:
    """The line numbers of a Markdown file's fenced code blocks, fences included."""
    return {n for b in fenced_blocks(path) for n in range(b.line - 1, b.end + 1)}


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def heading_anchors(path: Path) -> set[str]:
    fenced, seen, found = fenced_lines(path), {}, set()
    for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1):
        m = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m and n not in fenced:
            base = slug(m[1])
            found.add(base if base not in seen else f"{base}-{seen[base]}")  # repeats: -1, -2
            seen[base] = seen.get(base, 0) + 1
    return found


def test_slugs_follow_github() -> None:
    assert slug("`straw qualify`: measure the filesystem before trusting it") == \
        "straw-qualify-measure-the-filesystem-before-trusting-it"
    assert slug("Throughput against Ray's object store") == "throughput-against-rays-object-store"
    assert slug("Distributed on Ray (`straw.rollout.ray`, the `ray` extra)") == \
        "distributed-on-ray-strawrolloutray-the-ray-extra"


@pytest.mark.parametrize("path", guide(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    fenced = fenced_lines(path)
    # fenced code blanked (line numbers kept), inline code dropped: neither holds links; a
    # link's text may wrap over lines
    text = "\n".join("" if n in fenced else re.sub(r"(`+)(?:(?!\1).)+?\1", "", line)
                     for n, line in enumerate(path.read_text(encoding="utf-8").split("\n"), 1))
    broken = []
    for m in LINK.finditer(text):
        target, n = m[1], text.count("\n", 0, m.start()) + 1
        if SCHEME.match(target):
            continue  # http:, https:, mailto: ...
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            broken.append(f"{path.relative_to(ROOT)}:{n}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in heading_anchors(dest):
            broken.append(f"{path.relative_to(ROOT)}:{n}: {target} (no such heading in "
                          f"{dest.relative_to(ROOT)})")
    assert not broken, "\n".join(broken)
