"""The package's boundaries, checked on its import graph (read from the source, nothing runs).

The reader, the statistics, the views, the encoder, the plugin and the export must not import
TensorFlow or Keras: TensorBoard loads the plugin in a process that may have no TensorFlow,
and ``tb-gradmom export`` and `tb_gradmom.data` are for machines without it. The subprocess
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
NO_TF_MODULES = (
    "tb_gradmom",
    "tb_gradmom.metadata",
    "tb_gradmom.data",
    "tb_gradmom.reductions",
    "tb_gradmom.stats",
    "tb_gradmom.views",
    "tb_gradmom.encode",
    "tb_gradmom.plot",
    "tb_gradmom.export",
    "tb_gradmom.cli",
    "tb_gradmom.plugin_loader",
)
NO_TF_PACKAGES = ("tb_gradmom.plugin",)
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
    assert _chain_to_forbidden("tb_gradmom._core", graph)
    assert "tb_gradmom.metadata" in graph["tb_gradmom.plugin.plugin"]
    missing = [m for m in NO_TF_MODULES if m not in modules]
    assert not missing, f"NO_TF_MODULES names modules that do not exist: {missing}"


@pytest.mark.parametrize("module", _no_tf_modules(_modules()))
def test_layer_does_not_import_tensorflow(module):
    _, graph = _graph()
    chain = _chain_to_forbidden(module, graph)
    assert chain is None, " -> ".join(chain) + (
        ": this layer must run without TensorFlow; import it inside the function that needs it"
    )
