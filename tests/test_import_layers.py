"""No import circle among the repository's modules, and the benchmarks' layers import one way.

Imports are read from the sources (``ast``), at module level and inside functions alike: a
lazy import is still a dependency. ``from package import name`` counts as an import of
``package.name`` where that is a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("neuralops_gqa", "csrc_free_ops", "benchmarks")
# The benchmarks' layers, bottom up, and the layers each may import from.
LAYERS = {
    "base": {"cases", "timing", "peers", "targets", "cli", "results"},
    "runners": {
        "kernels",
        "host",
        "compiled",
        "memory",
        "users_shapes",
        "attention",
        "e2e_transformers",
        "profile_points",
        "split_probe",
        "block_stages",
        "call_steps",
    },
    "rendering": {"report", "docs_blocks"},
    "entry points": {"bench", "run_all", "ab"},
}
MAY_IMPORT = {
    "base": {"base"},
    "runners": {"base"},  # a runner stands alone: no runner imports another
    "rendering": {"base", "rendering"},  # rendering reads result files: it never imports a runner
    "entry points": {"base", "runners", "rendering", "entry points"},  # run_all runs bench
}


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _graph() -> dict[str, set[str]]:
    modules, graph = _modules(), {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
                    package = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                    base = f"{package}.{base}".rstrip(".")
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
        resolved = set()
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                resolved.add(target)
        graph[name] = resolved
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle, as the path that closes it (depth-first search)."""
    found, state = [], dict.fromkeys(graph, 0)  # 0 unseen, 1 on the path, 2 done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state[nxt] == 1:
                found.append([*path[path.index(nxt) :], nxt])
            elif state[nxt] == 0:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(graph):
        if state[node] == 0:
            visit(node, [node])
    return found


def test_no_import_circle() -> None:
    graph = _graph()
    assert {"neuralops_gqa", "csrc_free_ops.gqa_triton", "benchmarks.bench"} <= set(graph)
    circles = _cycles(graph)
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def test_the_circle_check_finds_circles() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_benchmarks_import_one_way() -> None:
    graph = _graph()
    layer_of = {f"benchmarks.{m}": layer for layer, members in LAYERS.items() for m in members}
    benchmarks = {m for m in graph if m.startswith("benchmarks.")}
    assert benchmarks == set(layer_of), (
        f"place every benchmarks module in a layer: {sorted(benchmarks ^ set(layer_of))}"
    )
    wrong = [
        f"{module} ({layer_of[module]}) imports {target} ({layer_of[target]})"
        for module in sorted(benchmarks)
        for target in sorted(graph[module] & benchmarks)
        if layer_of[target] not in MAY_IMPORT[layer_of[module]]
    ]
    assert not wrong, wrong
    product = [
        f"{m} imports {t}"
        for m in graph
        if not m.startswith("benchmarks")
        for t in graph[m]
        if t.startswith("benchmarks")
    ]
    assert not product, product
    kernels = [
        f"{m} imports {t}"
        for m in graph
        if m.startswith("csrc_free_ops")
        for t in graph[m]
        if t.startswith("neuralops_gqa")
    ]
    assert not kernels, kernels
