"""The package's layout by process (docs/architecture.md, "Where things live"): which krex
modules may import which. Read from the source (every import: top-level, in functions and under
TYPE_CHECKING), nothing imported.

Floors, lowest first: core (what every process shares; krex._native, the compiled layout, is
part of it); sim; tenant (inside the user's command); pool (a warm worker, which arms the
tenant's auto-regions); client and daemon (side by side: neither imports the other); bench;
then the package's face and the CLI (krex/__init__.py, krex/cli.py, krex/_native_build.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

KREX = Path(__file__).resolve().parents[1] / "krex"
FLOORS = {"core": 0, "sim": 1, "tenant": 2, "pool": 3, "client": 4, "daemon": 4, "bench": 5}
TOP = 6  # krex (its __init__), krex.cli, krex._native_build
SIDE_BY_SIDE = {("client", "daemon"), ("daemon", "client")}


def module_name(path: Path) -> str:
    rel = path.relative_to(KREX.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(KREX.rglob("*.py")) if "__pycache__" not in p.parts}


def imports(path: Path, name: str) -> set[str]:
    """The krex modules that `path` (module `name`) imports, wherever the import stands."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.split(".")[0] == "krex")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            if base.split(".")[0] != "krex":
                continue
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import module`
    known = modules()
    return {m for m in out if m in known and m != name}


def part(name: str) -> str:
    """The subpackage a module belongs to ("top" for the package's face and the CLI)."""
    parts = name.split(".")
    if name == "krex._native" or (len(parts) > 1 and parts[1] in FLOORS):
        return "core" if name == "krex._native" else parts[1]
    return "top"


def floor(name: str) -> int:
    p = part(name)
    return TOP if p == "top" else FLOORS[p]


GRAPH = {name: imports(path, name) for name, path in modules().items()}


def test_each_module_sits_in_a_subpackage_named_for_its_process() -> None:
    loose = sorted(n for n in GRAPH if part(n) == "top")
    assert loose == ["krex", "krex._native_build", "krex.cli"], loose
    for sub in FLOORS:
        init = KREX / sub / "__init__.py"
        assert init.is_file(), f"krex/{sub} is not a package"
        assert ast.get_docstring(ast.parse(init.read_text())), f"krex/{sub}: say what runs there"


def upward(graph: dict[str, set[str]], name: str) -> list[str]:
    """What `name` imports from a higher floor, or from beside it (client <-> daemon)."""
    return sorted(
        m
        for m in graph[name]
        if m != "krex" and (floor(m) > floor(name) or (part(name), part(m)) in SIDE_BY_SIDE)
    )


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """An import cycle (type-checking imports count: a tangle to read all the same)."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(graph[n]):
            if m == "krex":
                continue  # the package's face: every `import krex.x` runs it, none imports it
            if state.get(m) == 1:
                return [*path[path.index(m) :], m]
            if m not in state and (found := visit(m)):
                return found
        path.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


@pytest.mark.parametrize("name", sorted(GRAPH))
def test_no_import_runs_up_a_floor(name: str) -> None:
    bad = upward(GRAPH, name)
    assert not bad, f"{name} ({part(name)}) imports from above or beside it: {bad}"


def test_the_tenant_and_the_core_import_nothing_of_the_daemon_client_or_pool() -> None:
    for name, deps in GRAPH.items():
        if part(name) in ("core", "tenant"):
            assert not {part(m) for m in deps} & {"daemon", "client", "pool"}, name


def test_no_cycle_among_krex_modules() -> None:
    found = cycle(GRAPH)
    assert found is None, "import cycle: " + " -> ".join(found or [])


def test_the_rules_catch_what_they_forbid() -> None:
    """Made-up edges: the core importing the daemon (a floor up, and a cycle back down), the
    client importing the daemon (beside it)."""
    graph = {k: set(v) for k, v in GRAPH.items()}
    graph["krex.core.errors"].add("krex.daemon.daemon")
    graph["krex.client.watch"].add("krex.daemon.segments")
    assert upward(graph, "krex.core.errors") == ["krex.daemon.daemon"]
    assert upward(graph, "krex.client.watch") == ["krex.daemon.segments"]
    found = cycle(graph)
    assert found is not None and "krex.core.errors" in found


def test_where_things_live_lists_every_module_in_its_package_row() -> None:
    """docs/architecture.md's table has a row per package naming each of its modules."""
    doc = (KREX.parent / "docs" / "architecture.md").read_text()
    rows = {line.split("|")[2].strip(" `"): line for line in doc.splitlines() if "| `krex/" in line}
    for name, path in modules().items():
        parts = name.split(".")
        if (
            path.name == "__init__.py"
            or name == "krex._native"
            or "_auto" in parts
            or parts[1:3] == ["bench", "tasks"]
        ):
            continue
        folder = "krex/" + "".join(p + "/" for p in parts[1:-1])
        row = rows.get(folder)
        assert row is not None, f"no row for {folder}"
        assert f"`{parts[-1]}.py`" in row, f"{name} missing from the {folder} row"
