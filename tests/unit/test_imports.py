"""The import graph of node/, handler/ and pipeline/, read from the source (AST, nothing imported): no
module imports itself back through others, and the pure core (node/core) imports no adapter, no
`handler` module and nothing that does I/O or tells the time: cores take `now_ms` and return effects.

Imports inside functions count: a lazy import is still a dependency, it only moves the failure.
The allow-lists name what is known to break the rules today (issue 27); a new violation fails, and so
does an entry that no longer holds, so the lists can only shrink.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("node", "handler", "pipeline")
CORE = "node.core"

# Imports that close a cycle today, (importer, imported): each names the fix that removes it.
KNOWN_CYCLE_EDGES: dict[tuple[str, str], str] = {}

# Imports by node/core that break the pure-core rule today, (importer, imported).
KNOWN_CORE_VIOLATIONS: dict[tuple[str, str], str] = {}

# What node/core may never import: the adapters and the handler (any of `node` outside node/core counts
# as an adapter), and what does I/O, blocks or tells the time
CORE_FORBIDDEN = ("node.amqp", "node.peer", "node.admin", "node.store", "node.console", "node.http_port",
                  "node.runtime", "node.tools", "handler", "grpc", "proton", "cproton", "pysyncobj", "threading",
                  "_thread", "socket", "selectors", "asyncio", "uvloop", "time", "subprocess", "multiprocessing",
                  "concurrent")

# leaf modules: the standard library only, so any module (pipeline's tasks, bench/, the core's
# adapters) may import them without pulling anything in
LEAVES = {"node.net", "node.exit_codes"}


def _modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _imported_names(module: str, path: Path) -> set[str]:
    """Every dotted name `module` imports: the module, or the package whose name it takes."""
    names = set()
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for statement in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(statement, ast.Import):
            names.update(alias.name for alias in statement.names)
        elif isinstance(statement, ast.ImportFrom):
            base = statement.module or ""
            if statement.level:
                anchor = package[:len(package) - statement.level + 1]
                base = ".".join(anchor + ([statement.module] if statement.module else []))
            for alias in statement.names:  # `from a import b` of a module b depends on a.b, not on a's __init__
                names.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base)
    return names


IMPORTS = {module: _imported_names(module, path) for module, path in MODULES.items()}


def _project_module(name: str) -> str | None:
    """The module of node/, handler/ or pipeline/ that `name` loads (its longest known prefix)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _graph() -> dict[str, set[str]]:
    graph = {}
    for module, names in IMPORTS.items():
        graph[module] = {target for target in map(_project_module, names) if target and target != module}
    return graph


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module, iteratively (no recursion limit)."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph[successor]))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))
    return components


def _a_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """One cycle through the component's first module, as a path that ends where it starts."""
    members, start = set(component), component[0]
    paths = {start: [start]}
    frontier = [start]
    while frontier:  # breadth first: the shortest cycle back to start
        following = []
        for module in frontier:
            for successor in sorted(graph[module] & members):
                if successor == start:
                    return paths[module] + [start]
                if successor not in paths:
                    paths[successor] = paths[module] + [successor]
                    following.append(successor)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {component}")


def test_the_walk_sees_the_packages_and_their_imports():
    assert {"node.core.dispatch.queue", "node.amqp.loop", "handler.route_table", "pipeline.sink", "node.net"} <= set(MODULES)
    assert "node.core.group_map" in _graph()["handler.route_table"]
    assert "node.admin.commands" in _graph()["node.cli"]  # an import inside a function counts


def test_no_module_imports_itself_back_through_others():
    graph = _graph()
    for importer, imported in KNOWN_CYCLE_EDGES:
        graph[importer].discard(imported)
    cycles = [" -> ".join(_a_cycle(graph, component)) for component in _strongly_connected(graph)]
    assert cycles == [], "import cycles (break them with a leaf module both sides import):\n" + "\n".join(cycles)


def test_the_known_cycle_edges_still_exist_and_still_close_a_cycle():
    graph = _graph()
    for importer, imported in KNOWN_CYCLE_EDGES:
        assert imported in graph[importer], f"{importer} no longer imports {imported}: drop it from KNOWN_CYCLE_EDGES"
        in_a_cycle = any(importer in component and imported in component
                         for component in _strongly_connected(graph))
        assert in_a_cycle, f"{importer} -> {imported} closes no cycle any more: drop it from KNOWN_CYCLE_EDGES"


def _core_may_not_import(name: str) -> bool:
    outside_core = name.startswith("node.") and name != CORE and not name.startswith(CORE + ".")
    return outside_core or any(name == prefix or name.startswith(prefix + ".") for prefix in CORE_FORBIDDEN)


def _forbidden_in_core() -> set[tuple[str, str]]:
    return {(module, _project_module(name) or name)
            for module, names in IMPORTS.items() if module == CORE or module.startswith(CORE + ".")
            for name in names if _core_may_not_import(name)}


def test_the_pure_core_imports_no_adapter_no_handler_no_io_and_no_clock():
    new = sorted(_forbidden_in_core() - set(KNOWN_CORE_VIOLATIONS))
    assert new == [], "node/core must stay pure: " + ", ".join(f"{a} imports {b}" for a, b in new)


def test_the_known_core_violations_are_still_there():
    stale = sorted(set(KNOWN_CORE_VIOLATIONS) - _forbidden_in_core())
    assert stale == [], f"fixed, so drop them from KNOWN_CORE_VIOLATIONS: {stale}"


# node/core's subjects depend one way (node/core/__init__.py): a subject may import those after it in
# this order and none before it (the top-level modules of node/core serve them all)
CORE_SUBJECTS = ("node.core.shell", "node.core.cluster", "node.core.dispatch", "node.core.access")


def _subject_of(module: str) -> int | None:
    for rank, subject in enumerate(CORE_SUBJECTS):
        if module == subject or module.startswith(subject + "."):
            return rank
    return None


def test_the_cores_subjects_depend_one_way():
    backwards = sorted((module, name) for module, names in IMPORTS.items() if _subject_of(module) is not None
                       for name in names
                       if _subject_of(name) is not None and _subject_of(name) < _subject_of(module))
    assert backwards == [], "node/core's subjects depend one way (shell, cluster, dispatch, access): " + \
        ", ".join(f"{a} imports {b}" for a, b in backwards)
    assert all(_subject_of(module) is not None for module in ("node.core.dispatch.queue", "node.core.access.roles",
                                                                "node.core.cluster.protocol"))


def test_the_rule_names_adapters_clocks_and_threads_but_not_their_namesakes():
    for name in ("time", "threading.Lock", "node.amqp.loop", "node.config", "node.http_port.metrics", "grpc.aio",
                 "handler", "handler.route_table", "proton.reactor", "pysyncobj"):
        assert _core_may_not_import(name), name
    for name in ("timeit", "node.core.dispatch.queue", "node.core", "grpcx", "heapq", "handlers"):
        assert not _core_may_not_import(name), name


def test_leaf_modules_import_the_standard_library_only():
    for leaf in sorted(LEAVES):
        outside = sorted(name for name in IMPORTS[leaf]
                         if name.split(".")[0] not in sys.stdlib_module_names)
        assert outside == [], f"{leaf} is a leaf: it imports {outside}"
