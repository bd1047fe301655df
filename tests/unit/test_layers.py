"""The layer contract (:mod:`nemo_rl_gke.layers`) holds for every import in plugins/: module-level and inside functions.

Imports under ``if TYPE_CHECKING:`` are allowed to go anywhere (they never run). Each failure names the edge.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from nemo_rl_gke.layers import (
    AIRFLOW_FREE_AT_IMPORT,
    DECIDED_IN_DECIDE,
    GLUE,
    GLUE_ORDER,
    LAYERS,
    MAY_IMPORT,
    NO_AIRFLOW,
    glue_stage,
    layer_of,
)

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
PKG = "nemo_rl_gke"


@dataclass(frozen=True)
class Edge:
    """One imported name: importer -> module, where, and whether it runs at import time, in a function or never."""

    importer: str
    imported: str
    path: Path
    line: int
    kind: str  # "module", "function" or "type_checking"
    commented: bool

    def __str__(self) -> str:
        where = f"{self.path.relative_to(PLUGINS.parent)}:{self.line}"
        return (
            f"{self.importer} [{layer_of(self.importer)}] -> {self.imported} [{layer_of(self.imported)}] "
            f"({self.kind}, {where})"
        )


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((PLUGINS / PKG).rglob("*.py")):
        parts = list(path.relative_to(PLUGINS).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(module: str, path: Path) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement of a module with its kind."""

    def walk(node: ast.AST, kind: str) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, kind
            elif isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.body:
                    yield from walk(ast.Module(body=[sub], type_ignores=[]), "type_checking")
                for sub in child.orelse:
                    yield from walk(ast.Module(body=[sub], type_ignores=[]), kind)
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from walk(child, "function" if kind == "module" else kind)
            else:
                yield from walk(child, kind)

    yield from walk(ast.parse(path.read_text(), str(path)), "module")


def _targets(module: str, path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join([*package, base] if base else package)
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]


def _edges() -> list[Edge]:
    edges = []
    for module, path in MODULES.items():
        lines = path.read_text().splitlines()
        nodes = list(_imports(module, path))
        import_lines = {n for node, _ in nodes for n in range(node.lineno, node.end_lineno + 1)}
        for node, kind in nodes:
            above = node.lineno - 1  # the reason may sit above a run of imports
            while above in import_lines:
                above -= 1
            commented = "#" in lines[node.lineno - 1] or (above > 0 and lines[above - 1].strip().startswith("#"))
            for name in _targets(module, path, node):
                if name != PKG and not name.startswith(PKG + "."):
                    continue
                target = name
                while target not in MODULES:
                    target = target.rsplit(".", 1)[0]
                if target != module:
                    edges.append(Edge(module, target, path, node.lineno, kind, commented))
    return edges


EDGES = _edges()


def _third_party(kind: str | None = None) -> Iterator[tuple[str, Path, int, str, str]]:
    for module, path in MODULES.items():
        for node, node_kind in _imports(module, path):
            if kind is not None and node_kind != kind:
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            for name in names:
                if not getattr(node, "level", 0):
                    yield module, path, node.lineno, node_kind, name


def test_the_walk_sees_the_package() -> None:
    """A walk that found nothing would pass every check below."""
    assert len(MODULES) > 50 and len(EDGES) > 300
    assert {e.kind for e in EDGES} == {"module", "function", "type_checking"}


def test_every_layer_has_its_rules() -> None:
    assert set(MAY_IMPORT) == {*LAYERS, GLUE}
    assert all(allowed <= set(LAYERS) for allowed in MAY_IMPORT.values())
    assert layer_of(PKG) == GLUE and layer_of(f"{PKG}.operators.base") == GLUE


def test_no_import_goes_up_a_layer() -> None:
    upward = [
        str(e)
        for e in EDGES
        if e.kind != "type_checking"
        and layer_of(e.importer) != layer_of(e.imported)
        and layer_of(e.imported) not in MAY_IMPORT[layer_of(e.importer)]
    ]
    assert not upward, "imports against nemo_rl_gke/layers.py's MAY_IMPORT:\n" + "\n".join(upward)


def _glue_order_breaches(edges: list[Edge]) -> list[str]:
    """Edges between staged glue modules that go back in GLUE_ORDER, or load a trigger into an operator at import."""
    wrong = []
    for e in edges:
        if e.kind == "type_checking":
            continue
        importer, imported = glue_stage(e.importer), glue_stage(e.imported)
        if importer is None or imported is None:
            continue
        if imported < importer:
            wrong.append(f"{e} (goes back in GLUE_ORDER)")
        elif imported > importer and e.kind == "module" and GLUE_ORDER[importer] == "operators":
            wrong.append(f"{e} (an operator imports a trigger at module level)")
    return wrong


def _bypasses(module: str, path: Path) -> list[str]:
    """The uses in a glue module of what decide/ decides with (DECIDED_IN_DECIDE): imported by name, or read off an
    imported module (``capacity.pool_capacity``)."""
    if layer_of(module) != GLUE:
        return []
    found, modules = [], {}
    for node, _ in _imports(module, path):
        if isinstance(node, ast.ImportFrom) and node.module:
            found += [f"{path.name}:{node.lineno} imports {node.module}.{a.name}" for a in node.names
                      if f"{node.module}.{a.name}" in DECIDED_IN_DECIDE]  # fmt: skip
            modules |= {a.asname or a.name: f"{node.module}.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            modules |= {a.asname: a.name for a in node.names if a.asname}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            name = f"{modules[node.value.id]}.{node.attr}"
            if name in DECIDED_IN_DECIDE:
                found.append(f"{path.name}:{node.lineno} uses {name}")
    return found


def test_the_glue_keeps_its_order_and_an_operator_loads_a_trigger_only_to_defer() -> None:
    wrong = _glue_order_breaches(EDGES)
    assert not wrong, "\n".join(wrong)


def test_the_glue_takes_its_decisions_from_the_decisions_layer() -> None:
    bypass = [b for module, path in MODULES.items() for b in _bypasses(module, path)]
    assert not bypass, "the glue decides with an action's verdict; ask decide/ instead:\n" + "\n".join(bypass)


def test_the_glue_rules_catch_what_they_name(tmp_path: Path) -> None:
    here = Path(__file__)
    op, trig, factory = f"{PKG}.operators.rayjob", f"{PKG}.triggers.rayjob", f"{PKG}.dag_factory"
    breaches = _glue_order_breaches([
        Edge(op, trig, here, 1, "module", False),  # a trigger loaded with the operator
        Edge(trig, op, here, 2, "function", False),  # a trigger reaching back into an operator
        Edge(op, factory, here, 3, "function", False),
        Edge(op, trig, here, 4, "function", True),  # the deferral: allowed
        Edge(factory, op, here, 5, "module", False),  # allowed
    ])  # fmt: skip
    assert [b.split(" (")[-1] for b in breaches] == [
        "an operator imports a trigger at module level)", "goes back in GLUE_ORDER)", "goes back in GLUE_ORDER)"
    ]  # fmt: skip
    sneaky = tmp_path / "sweeper.py"
    sneaky.write_text("def f():\n    from nemo_rl_gke.gcp.resources import delete_verdict\n")
    assert _bypasses(f"{PKG}.sweeper", sneaky) == ["sweeper.py:2 imports nemo_rl_gke.gcp.resources.delete_verdict"]
    assert _bypasses(f"{PKG}.decide.teardown", sneaky) == []
    # The old ladder walk in the operator: it told the rung itself from the pool, past decide/ladder.py.
    sneaky.write_text("from nemo_rl_gke.run import capacity\n\ndef f(pool):\n    return capacity.pool_capacity(pool)\n")
    assert _bypasses(f"{PKG}.sweeper", sneaky) == ["sweeper.py:4 uses nemo_rl_gke.run.capacity.pool_capacity"]
    assert _bypasses(f"{PKG}.decide.ladder", sneaky) == []


def _cycles(edges: list[Edge]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.importer, set()).add(e.imported)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = _pop_component(stack, on_stack, node)
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _pop_component(stack: list[str], on_stack: set[str], root: str) -> list[str]:
    """Tarjan's component of ``root``: the stack popped down to it."""
    component = []
    while True:
        member = stack.pop()
        on_stack.discard(member)
        component.append(member)
        if member == root:
            return component


def test_the_cycle_finder_finds_a_cycle() -> None:
    here = Path(__file__)
    loop = [Edge("a", "b", here, 1, "module", False), Edge("b", "c", here, 1, "function", False)]
    assert _cycles([*loop, Edge("c", "a", here, 1, "function", False)]) == [["a", "b", "c"]]
    assert _cycles(loop) == []


@pytest.mark.parametrize(
    "kinds",
    [("module",), ("module", "function"), ("module", "function", "type_checking")],
    ids=["module-level", "with-function-level", "with-type-level"],
)
def test_no_import_cycle(kinds: tuple[str, ...]) -> None:
    edges = [e for e in EDGES if e.kind in kinds]
    cycles = _cycles(edges)
    detail = ["\n".join(str(e) for e in edges if e.importer in c and e.imported in c) for c in cycles]
    assert not cycles, "import cycles:\n" + "\n\n".join(detail)


def test_each_function_level_import_of_the_package_says_why() -> None:
    """Module level is the rule (the graph stays visible); an import inside a function needs a reason on its line or
    above it (or above the run of imports it is in): a cycle it breaks, or a heavy module kept out of DAG parsing."""
    silent = sorted(
        {f"{e.path.relative_to(PLUGINS.parent)}:{e.line}" for e in EDGES if e.kind == "function" and not e.commented}
    )
    assert not silent, "function-level imports without a '# why' comment on or above them:\n" + "\n".join(silent)


def test_remote_imports_nothing_of_the_package_or_airflow() -> None:
    """remote/ is shipped to the cluster as is: only itself, the standard library and what the image has."""
    outside = [str(e) for e in EDGES if layer_of(e.importer) in NO_AIRFLOW and layer_of(e.imported) not in NO_AIRFLOW]
    airflow = [
        f"{module}:{line} imports {name}"
        for module, _, line, _, name in _third_party()
        if layer_of(module) in NO_AIRFLOW and name.split(".")[0] == "airflow"
    ]
    assert not outside and not airflow, "\n".join(outside + airflow)


def test_lower_layers_import_no_airflow_at_module_level() -> None:
    found = [
        f"{path.relative_to(PLUGINS.parent)}:{line} imports {name}"
        for module, path, line, _, name in _third_party("module")
        if layer_of(module) in AIRFLOW_FREE_AT_IMPORT and name.split(".")[0] == "airflow"
    ]
    assert not found, "\n".join(found)
