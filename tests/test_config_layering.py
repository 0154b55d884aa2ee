"""The import graph of `asyncrl/` has layers and no loop: each component owns its config dataclass,
`asyncrl.config.run` composes them, and only what sits above it reads the composed RunConfig.

    services/, launch/, bench/        entry points
    asyncrl/run/                      the run assembled from its RunConfig: run directory, service start, feeder
    asyncrl/config/                   RunConfig, the loader, the reference doc
    replay, learner, generator, ...   components: each reads its own config, handed in from above
    records, wire, net, durable, ...  foundations

A package is one folder (or one module) right under `asyncrl/`; an arrow is any import, at the top of a file or
inside a function. A component's `__main__.py` is a program (`python -m asyncrl.eval`), which nothing imports:
like services/, it may read a run's whole config, so its arrows are left out.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "asyncrl"
RUN = "asyncrl.config.run"
ABOVE_COMPONENTS = {"config", "run"}  # the run config, and the run assembled from it
ENTRY_POINT = "__main__.py"


def imported(path: Path) -> list[tuple[str, int]]:
    """(module, line) of every import in the file, relative ones resolved (`from asyncrl import x`: asyncrl.x)."""
    module = ".".join(path.relative_to(REPO).with_suffix("").parts)
    return imports_in(path.read_text(), module + ".__init__" if path.name == "__init__.py" else module)


def imports_in(source: str, module: str) -> list[tuple[str, int]]:
    package = module.split(".")
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: -node.level] + ([node.module] if node.module else [])) if node.level else node.module
            found.append((base, node.lineno))
            if base == "asyncrl":  # from asyncrl import records
                found += [(f"{base}.{a.name}", node.lineno) for a in node.names]
    return found


def package_of(module: str) -> str | None:
    """The package right under asyncrl/ that `module` belongs to (None: outside asyncrl)."""
    parts = module.split(".")
    if parts[0] != "asyncrl" or len(parts) < 2:
        return None
    return parts[1] if (ROOT / parts[1]).is_dir() or (ROOT / f"{parts[1]}.py").is_file() else None


def sources() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py") if p.name != ENTRY_POINT)


def arrows() -> dict[tuple[str, str], list[str]]:
    """(package, package it imports) -> ["file:line module", ...]."""
    found: dict[tuple[str, str], list[str]] = defaultdict(list)
    for path in sources():
        src = path.relative_to(ROOT).parts[0].removesuffix(".py")
        for module, line in imported(path):
            dst = package_of(module)
            if dst is not None and dst != src:
                found[(src, dst)].append(f"{path.relative_to(REPO)}:{line} {module}")
    return found


def cycles(edges: set[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected groups of more than one package (Tarjan)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def test_components_read_their_own_config_never_the_run_config():
    bad = [f"{path.relative_to(REPO)}:{line} imports {module}"
           for path in sources() if path.relative_to(ROOT).parts[0] not in ABOVE_COMPONENTS
           for module, line in imported(path) if package_of(module) in ABOVE_COMPONENTS]
    assert not bad, ("a component imports the run config or the run above it; hand it its own config (or the few "
                     "values it needs) from services/*.py or launch/ instead:\n" + "\n".join(bad))


def test_no_package_imports_back_in_a_circle():
    found = arrows()
    loops = cycles(set(found))
    detail = [f"{a} -> {b}: {'; '.join(found[(a, b)])}" for group in loops for a in group for b in group
              if (a, b) in found]
    assert not loops, f"packages in a circle {loops}; the arrows between them:\n" + "\n".join(detail)


def test_the_check_sees_a_circle_and_every_kind_of_import():
    assert cycles({("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}) == [["a", "b", "c"]]
    source = "from asyncrl import records\nfrom ..config import run\ndef f():\n    import asyncrl.replay.hub\n"
    found = {package_of(m) for m, _ in imports_in(source, "asyncrl.learner.service")}
    assert {"records", "config", "replay"} <= found  # a package's names, a relative import, one inside a function


def test_component_configs_import_no_assembly_or_run_config():
    for path in [*ROOT.glob("*/config.py"), *ROOT.glob("config/*.py")]:
        if path.relative_to(ROOT).as_posix() in {"config/run.py", "config/reference.py"}:
            continue
        bad = {m for m, _ in imported(path) if m == RUN or m.endswith((".build", ".service", ".worker", ".hub"))}
        assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)}"
