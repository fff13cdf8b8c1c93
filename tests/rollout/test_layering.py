"""straw.rollout is framework-neutral and looks down only: it imports the standard library,
NumPy and the core's public names; importing it loads no torch, Ray, vLLM, vime or
Megatron; the core never imports it.

LAYERING DECISION (issue 16): torch is allowed in exactly one module of the layer,
``straw/rollout/archive_pt.py`` (``.pt`` debug dumps are torch's format), and there only
inside functions (imported lazily, behind the ``torch`` extra), so that importing
``straw.rollout``, or that module, still loads no torch.

The other exception is ``straw.rollout.ray`` (the distributed mode, issue 17), the only
package that may import Ray."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROLLOUT = ROOT / "straw" / "rollout"
TORCH_MODULE = ROLLOUT / "archive_pt.py"  # the one module that may import torch, lazily
RAY_PACKAGE = ROLLOUT / "ray"


def imports(path: pathlib.Path) -> list[tuple[str, list[str], int]]:
    """(module, names, level) of every import in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(a.name, [], 0) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.module or "", [a.name for a in node.names], node.level))
    return found


def test_rollout_imports_only_stdlib_numpy_and_public_core_names():
    for path in sorted(ROLLOUT.rglob("*.py")):
        for module, names, level in imports(path):
            top = module.split(".")[0]
            if level:  # within straw.rollout
                continue
            if top == "straw":
                assert not module.startswith("straw.rollout"), (path, module)
                assert not any(n.startswith("_") for n in names), \
                    f"{path.name} imports private core names {names} from {module}"
                continue
            if top == "torch" and path == TORCH_MODULE:
                continue  # (inside functions only: the next test)
            if top == "ray" and RAY_PACKAGE in path.parents:
                continue  # straw.rollout.ray, the distributed mode: Ray is its point
            assert top in sys.stdlib_module_names or top == "numpy", \
                f"{path.name} imports {module}: straw.rollout is framework-neutral"


def test_only_the_ray_package_imports_ray():
    importers = {path.relative_to(ROOT).as_posix()
                 for path in sorted((ROOT / "straw").rglob("*.py"))
                 for module, _, _ in imports(path) if module.split(".")[0] == "ray"}
    assert importers, "straw.rollout.ray imports ray: this test reads the imports"
    assert all(p.startswith("straw/rollout/ray/") for p in importers), importers


def test_torch_is_imported_only_inside_functions_of_archive_pt():
    tree = ast.parse(TORCH_MODULE.read_text())
    lazy = {id(node) for f in ast.walk(tree)
            if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            for node in ast.walk(f)}
    torch_imports = [node for node in ast.walk(tree)
                     if (isinstance(node, ast.Import)
                         and any(a.name.split(".")[0] == "torch" for a in node.names))
                     or (isinstance(node, ast.ImportFrom)
                         and (node.module or "").split(".")[0] == "torch")]
    assert torch_imports, "archive_pt imports torch (lazily) to read and write .pt dumps"
    assert all(id(node) in lazy for node in torch_imports), \
        "archive_pt imports torch at module level: import it inside its functions"


def test_the_core_never_imports_rollout():
    # the demo (the job `python3 dev.py demo` runs) sits on top of both layers: it is
    # part of the `straw` command (straw/cli/demo.py), which no core module imports
    for path in sorted((ROOT / "straw").glob("*.py")):
        for module, _, level in imports(path):
            assert "demo" not in module.split("."), (path, module, level)
            assert "rollout" not in module.split("."), (path, module, level)


def test_importing_rollout_loads_no_framework():
    code = ("import sys, straw.rollout, straw.rollout.archive_pt, straw.rollout.replay, straw.rollout.generate, straw.rollout.producer; "
            "bad = [m for m in ('torch', 'ray', 'vllm', 'vime', "
            "'megatron') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
