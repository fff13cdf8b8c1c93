"""The shape of the code, as a ratchet (DESIGN: small modules with one concern, layers that
look down only).

* Sizes: no module over ``MODULE_LINES`` lines, no class over ``CLASS_LINES``, no function
  over ``FUNCTION_LINES``, measured from the AST.  ``OVERSIZED`` lists today's offenders
  with their size: an offender may shrink, never grow, and leaves the list once it fits
  (a stale entry fails, so the list only gets shorter).  Nothing new may join it.
* Layers: the core never imports the rollout layer, the CLI, qualify, the spec, the model
  or the fault injection; the rollout layer never imports the CLI or qualify; Ray is
  imported in ``straw.rollout.ray`` alone; torch only where a module says it may.
* Import circles (lazy, function-level imports included) among ``straw`` and among
  ``fault_injection`` modules: only those of ``CIRCLES`` may remain, and they may only go.
* ``straw.rollout.__all__`` has at most ``ROLLOUT_EXPORTS`` names (internals stay inside).
"""

from __future__ import annotations

import ast
import os
from collections.abc import Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODULE_LINES, CLASS_LINES, FUNCTION_LINES = 600, 500, 70

# (kind, qualified name) -> lines today.  May only shrink; remove an entry once it fits.
OVERSIZED: dict[tuple[str, str], int] = {}

# import circles (each a sorted tuple of modules) still to break: none left; may only go
CIRCLES: set[tuple[str, ...]] = set()
ROLLOUT_EXPORTS = 28
TORCH_MODULES = {"straw.tensors.frameworks", "straw.rollout.archive_pt"}  # lazily, where it is needed


def _modules(package: str) -> Iterator[tuple[str, str]]:
    """(dotted module name, path) of every module of ``package``."""
    base = os.path.join(ROOT, package)
    for d, dirs, files in os.walk(base):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(d, f), ROOT)[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                yield ".".join(rel), os.path.join(d, f)


def _tree(path: str) -> ast.Module:
    with open(path) as f:
        return ast.parse(f.read(), path)


def sizes(package: str) -> dict[tuple[str, str], int]:
    """Every module's, class's and function's size in lines."""
    out: dict[tuple[str, str], int] = {}
    for mod, path in _modules(package):
        tree = _tree(path)
        with open(path) as f:
            out[("module", mod)] = sum(1 for _ in f)

        def visit(node: ast.AST, prefix: str) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    name = f"{prefix}.{child.name}"
                    kind = "class" if isinstance(child, ast.ClassDef) else "function"
                    assert child.end_lineno is not None
                    out[(kind, name)] = child.end_lineno - child.lineno + 1
                    visit(child, name)
        visit(tree, mod)
    return out


def _limit(kind: str) -> int:
    return {"module": MODULE_LINES, "class": CLASS_LINES, "function": FUNCTION_LINES}[kind]


def imports(package: str) -> dict[str, set[str]]:
    """Module -> the modules it imports (absolute names, lazy imports included)."""
    mods = dict(_modules(package))
    out: dict[str, set[str]] = {}
    for mod, path in mods.items():
        is_pkg = path.endswith("__init__.py")
        here = mod if is_pkg else mod.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                # ``from pkg import mod`` depends on the module; ``from mod import name``
                # on the module that defines the name
                subs = {f"{target}.{a.name}" for a in node.names} & mods.keys()
                found.update(subs)
                if len(subs) < len(node.names):
                    found.add(target)
        out[mod] = found
    return out


def internal_graph(package: str) -> dict[str, set[str]]:
    graph = imports(package)
    known = set(graph)
    return {m: {t for t in deps if t in known and t != m} for m, deps in graph.items()}


def circles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: set[tuple[str, ...]] = set()
    counter = [0]

    def strong(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.add(tuple(sorted(comp)))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def _packages_import_graphs() -> dict[str, set[str]]:
    graph = internal_graph("straw")
    graph.update(internal_graph("fault_injection"))
    return graph


# --- the ratchet ---------------------------------------------------------------------------


def test_nothing_new_is_oversized_and_no_offender_grows():
    measured = {**sizes("straw"), **sizes("fault_injection")}
    over = {k: n for k, n in measured.items() if n > _limit(k[0])}
    new = sorted(f"{k[0]} {k[1]}: {n} lines (limit {_limit(k[0])})"
                 for k, n in over.items() if k not in OVERSIZED)
    grown = sorted(f"{k[0]} {k[1]}: {n} lines, allowed {OVERSIZED[k]}"
                   for k, n in over.items() if k in OVERSIZED and n > OVERSIZED[k])
    assert not new, "split these (or their new code) instead:\n" + "\n".join(new)
    assert not grown, "these may only shrink:\n" + "\n".join(grown)


def test_the_allow_list_only_shrinks():
    measured = {**sizes("straw"), **sizes("fault_injection")}
    stale = sorted(f"{k[0]} {k[1]}" for k in OVERSIZED
                   if measured.get(k, 0) <= _limit(k[0]))
    assert not stale, "these fit now (or are gone): remove them from OVERSIZED:\n" + \
        "\n".join(stale)


def test_no_new_import_circle():
    found = circles(_packages_import_graphs())
    assert not found - CIRCLES, f"new import circles: {sorted(found - CIRCLES)}"
    assert not CIRCLES - found, f"gone, remove from CIRCLES: {sorted(CIRCLES - found)}"


def test_layers_look_down_only():
    graph = imports("straw")
    bad = []
    for mod, deps in sorted(graph.items()):
        layer = mod.split(".")[1] if mod.count(".") else ""
        for d in sorted(deps):
            top = d.split(".")[0]
            if top in ("spec", "model", "fault_injection", "tests"):
                bad.append(f"{mod} imports {d} (straw never imports {top})")
            if layer not in ("rollout", "cli", "qualify") and \
                    d.startswith(("straw.rollout", "straw.cli", "straw.qualify")):
                bad.append(f"{mod} imports {d} (the core looks down only)")
            if layer == "rollout" and d.startswith(("straw.cli", "straw.qualify")):
                bad.append(f"{mod} imports {d} (the rollout layer never imports it)")
            if top == "ray" and not mod.startswith("straw.rollout.ray"):
                bad.append(f"{mod} imports {d} (Ray lives in straw.rollout.ray alone)")
            if top == "torch" and mod not in TORCH_MODULES:
                bad.append(f"{mod} imports {d} (torch only in {sorted(TORCH_MODULES)})")
    assert not bad, "\n".join(bad)


def test_the_rollout_layer_exports_only_its_interface():
    import straw.rollout
    assert len(straw.rollout.__all__) <= ROLLOUT_EXPORTS


def test_the_tools_find_what_they_look_for():
    # the measures themselves: a circle and an oversized function are seen
    assert circles({"a": {"b"}, "b": {"a"}, "c": set()}) == {("a", "b")}
    sized = sizes("tests")
    assert sized[("function", "tests.test_architecture.circles")] > 20
    graph = internal_graph("straw")
    assert "straw.pool.store" in graph["straw.queue.coordinator"]


# --- the core's packages -------------------------------------------------------------------

# Lowest first: a package imports only its own layer and those beneath it.  ``pool`` and
# ``read`` are one layer (a store opens read sessions; a read checks the pool's references).
CORE_LAYERS: list[set[str]] = [
    {"straw.durable"},
    {"straw.pool", "straw.read"},
    {"straw.tensors"},
    {"straw.sample_codec"},
    {"straw.queue"},
]
# (importer, imported) crossing upward on purpose, with the reason; may only go
UPWARD: dict[tuple[str, str], str] = {
    ("straw.read.ranges", "straw.tensors.format"):
        "a range read checks a tensor.v1 record's metadata (the format module alone)",
}
# The old module paths callers import (straw-queue, vime, tests): thin re-exports of the
# names' homes.  Inside the engine a name is imported from its home, never through them.
SHIMS = {f"straw.{m}" for m in (
    "catalog", "catalog_read", "catalog_roots", "catalog_snapshot", "catalog_state", "codec",
    "coordinator", "framing", "history", "holder", "holds", "journal", "journal_files",
    "pack", "queue_marker", "queue_names", "queue_state", "ranges", "reader", "recovery",
    "refs", "store", "tensor", "tensor_format", "writer")}


def _package_of(mod: str) -> str | None:
    for layer in CORE_LAYERS:
        for pkg in layer:
            if mod == pkg or mod.startswith(pkg + "."):
                return pkg
    return None


def test_the_old_paths_are_thin():
    # imports, __all__, an alias of the new module (sys.modules), and at most one small
    # class that forwards a setting (straw.tensor.CHUNK_BYTES)
    fat = []
    for mod, path in _modules("straw"):
        if mod not in SHIMS:
            continue
        body = [n for n in _tree(path).body
                if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        logic = [n for n in body if not isinstance(n, (ast.Import, ast.ImportFrom, ast.Assign,
                                                       ast.AnnAssign))]
        if len(logic) > 1 or any(not isinstance(n, ast.ClassDef) for n in logic):
            fat.append(mod)
    assert not fat, f"old paths that hold code (move it to its home): {fat}"
    assert SHIMS <= {m for m, _ in _modules("straw")}, "a listed old path is gone"


def test_core_packages_look_down_and_import_names_from_their_homes():
    rank = {pkg: i for i, layer in enumerate(CORE_LAYERS) for pkg in layer}
    bad, crossings = [], set()
    for mod, deps in sorted(internal_graph("straw").items()):
        pkg = _package_of(mod)
        if pkg is None:
            continue
        for d in sorted(deps):
            other = _package_of(d)
            if d in SHIMS:
                bad.append(f"{mod} imports {d}, an old path: import from the name's home")
            elif other is not None and rank[other] > rank[pkg]:
                crossings.add((mod, d))
    bad += [f"{m} imports {d} (a higher layer)" for m, d in sorted(crossings - UPWARD.keys())]
    assert not bad, "\n".join(bad)
    assert not UPWARD.keys() - crossings, "gone, remove from UPWARD"
