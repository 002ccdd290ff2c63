"""The package's boundaries, checked on its import graph (read from the source, nothing runs).

The reader, the statistics, the views, the encoder, the plugin and the export must not import
TensorFlow or Keras: TensorBoard loads the plugin in a process that may have no TensorFlow,
and ``tb-gradmom export`` and `tb_gradmom.analysis.data` are for machines without it. The subprocess
tests (`tests/test_data.py`, `tests/test_plugin_subprocess.py`) check that at run time for the
paths they take; this test checks every module of those layers and everything they import at
module level, transitively, so a new import anywhere below them is caught. Imports inside
functions (lazy ones, like the figures' matplotlib) are not module-level and are allowed.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "tb_gradmom"

# The layers that run without TensorFlow: numpy, protobuf and TensorBoard only.
NO_TF_MODULES = ("tb_gradmom", "tb_gradmom.metadata", "tb_gradmom.cli")
# Every module of these packages, present and future.
NO_TF_PACKAGES = ("tb_gradmom.analysis", "tb_gradmom.viz", "tb_gradmom.plugin")

# The rooms and what each may import from the others (a layered contract, as import-linter's
# "layers"): the core knows nothing of logging or showing; the writers use the core; analysis
# is the numpy layer under the figures and the plugin; the figures and the plugin do not know
# each other. `metadata` (the format contract) and `_compat` (private-API adapters) are shared.
ROOMS: dict[str, frozenset[str]] = {
    "tb_gradmom.core": frozenset({"tb_gradmom._compat"}),
    "tb_gradmom.writers": frozenset(
        {"tb_gradmom.core", "tb_gradmom._compat", "tb_gradmom.metadata"}
    ),
    "tb_gradmom.analysis": frozenset({"tb_gradmom.metadata"}),
    "tb_gradmom.viz": frozenset({"tb_gradmom.analysis", "tb_gradmom.metadata"}),
    "tb_gradmom.plugin": frozenset({"tb_gradmom.analysis", "tb_gradmom.metadata"}),
}
FORBIDDEN = ("tensorflow", "keras", "tf_keras")


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, pathlib.Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _top_level_imports(path: pathlib.Path, module: str) -> set[str]:
    """The modules imported when ``module`` is imported: statements outside functions and
    classes' methods (``if``/``try`` blocks included), relative imports resolved."""
    tree = ast.parse(path.read_text("utf-8"), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()

    def visit(nodes):
        for node in nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(node, ast.Import):
                out.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                out.add(base)
                # `from pkg import name` may import the submodule pkg.name
                out.update(f"{base}.{a.name}" for a in node.names)
            elif isinstance(node, ast.If) and _is_type_checking(node.test):
                continue  # typing-only imports never run
            for field in ("body", "orelse", "finalbody", "handlers"):
                visit(getattr(node, field, []) or [])

    visit(tree.body)
    return out


def _is_type_checking(test) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _graph():
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        graph[name] = {
            imp
            for imp in _top_level_imports(path, name)
            if imp in modules or imp.split(".")[0] in FORBIDDEN
        }
    return modules, graph


def _chain_to_forbidden(start: str, graph) -> list[str] | None:
    """An import chain from ``start`` to TensorFlow or Keras, or None."""
    seen = {start: None}
    queue = [start]
    while queue:
        cur = queue.pop(0)
        for nxt in sorted(graph.get(cur, ())):
            if nxt in seen:
                continue
            seen[nxt] = cur
            if nxt.split(".")[0] in FORBIDDEN:
                chain = [nxt]
                while seen[chain[-1]] is not None:
                    chain.append(seen[chain[-1]])
                return chain[::-1]
            queue.append(nxt)
    return None


def _no_tf_modules(modules) -> list[str]:
    names = [m for m in NO_TF_MODULES if m in modules]
    for pkg in NO_TF_PACKAGES:
        names += sorted(m for m in modules if m == pkg or m.startswith(pkg + "."))
    return names


def test_the_graph_is_read():
    modules, graph = _graph()
    # Sanity: the core does import TensorFlow, and the plugin imports the reader layer.
    assert _chain_to_forbidden("tb_gradmom.core.moments", graph)
    assert "tb_gradmom.metadata" in graph["tb_gradmom.plugin.plugin"]
    missing = [m for m in NO_TF_MODULES if m not in modules]
    assert not missing, f"NO_TF_MODULES names modules that do not exist: {missing}"


def _room(module: str) -> str | None:
    for room in ROOMS:
        if module == room or module.startswith(room + "."):
            return room
    return None


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_rooms_import_only_what_their_contract_allows(room):
    """Module-level and function-level imports alike: a lazy import still couples the rooms."""
    modules = _modules()
    bad = []
    for name, path in sorted(modules.items()):
        if _room(name) != room:
            continue
        for node in ast.walk(ast.parse(path.read_text("utf-8"), str(path))):
            if isinstance(node, ast.ImportFrom) and not node.level:
                targets = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                if target not in modules or target == "tb_gradmom":
                    continue
                other = _room(target)
                allowed = ROOMS[room] | {room}
                if other is None:
                    other = target  # a top-level module: metadata, _compat, cli, demo
                    if any(target == a or target.startswith(a + ".") for a in allowed):
                        continue
                elif other in allowed:
                    continue
                bad.append(f"{name}:{node.lineno} imports {target}")
    assert not bad, f"{room} may import only {sorted(ROOMS[room])}; found:\n" + "\n".join(bad)


def test_every_module_is_in_a_room_or_known():
    top_level = {
        "tb_gradmom",
        "tb_gradmom.metadata",
        "tb_gradmom.cli",
        "tb_gradmom.demo",
        "tb_gradmom.demo_mislabelled",
    }
    homeless = [
        m
        for m in _modules()
        if _room(m) is None and m not in top_level and not m.startswith("tb_gradmom._compat")
    ]
    assert not homeless, f"modules outside the layout of docs/CONTRACTS.md: {homeless}"


@pytest.mark.parametrize("module", _no_tf_modules(_modules()))
def test_layer_does_not_import_tensorflow(module):
    _, graph = _graph()
    chain = _chain_to_forbidden(module, graph)
    assert chain is None, " -> ".join(chain) + (
        ": this layer must run without TensorFlow; import it inside the function that needs it"
    )
