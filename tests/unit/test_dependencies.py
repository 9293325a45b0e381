"""pyproject.toml's runtime dependencies are what the node imports: no more (grpcio-tools generates
code, tqdm draws bars for people watching tools), no less. Read from the source (AST), so lazy imports
count too."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NODE_PACKAGES = ("node", "handler", "proto")  # what `grouper node` and its raft member process run
OWN_PACKAGES = {"node", "handler", "proto", "pipeline", "bench", "tests"}
# tools for a person at a terminal, never imported by the node: their packages come with the pipeline
# and bench extras
TOOL_MODULES = {"node/tools/progress.py"}


def _imported_top_names(path: Path) -> set[str]:
    names = set()
    for statement in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(statement, ast.Import):
            names.update(alias.name.split(".")[0] for alias in statement.names)
        elif isinstance(statement, ast.ImportFrom) and not statement.level and statement.module:
            names.add(statement.module.split(".")[0])
    return names


def _sources(packages) -> list[Path]:
    return [path for package in packages for path in sorted((ROOT / package).rglob("*.py"))]


def _project() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as handle:
        return tomllib.load(handle)["project"]


def _distribution(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_no_module_imports_grpc_tools_the_generated_modules_are_committed():
    importers = [str(path.relative_to(ROOT)) for path in _sources(sorted(OWN_PACKAGES))
                 if "grpc_tools" in _imported_top_names(path)]
    assert importers == []


def test_the_code_generator_and_the_progress_bars_are_extras_not_runtime_dependencies():
    project = _project()
    runtime = {_distribution(requirement) for requirement in project["dependencies"]}
    extras = {name: {_distribution(requirement) for requirement in requirements}
              for name, requirements in project["optional-dependencies"].items()}
    assert "grpcio-tools" not in runtime and "grpcio-tools" in extras["proto"]
    assert "tqdm" not in runtime and "tqdm" in extras["pipeline"] and "tqdm" in extras["bench"]


def test_every_package_the_node_imports_is_a_runtime_dependency():
    runtime = {_distribution(requirement) for requirement in _project()["dependencies"]}
    providers = metadata.packages_distributions()
    missing = {}
    for path in _sources(NODE_PACKAGES):
        if str(path.relative_to(ROOT)) in TOOL_MODULES:
            continue
        for name in _imported_top_names(path) - OWN_PACKAGES - set(sys.stdlib_module_names):
            distributions = {distribution.lower().replace("_", "-") for distribution in providers.get(name, [])}
            if not distributions & runtime:
                missing.setdefault(name, []).append(str(path.relative_to(ROOT)))
    assert missing == {}, f"imported by the node but not in pyproject.toml's dependencies: {missing}"


def test_the_node_never_imports_the_tool_modules_whose_packages_are_extras():
    tool_names = {str(Path(module).with_suffix("")).replace("/", ".") for module in TOOL_MODULES}
    importers = []
    for path in _sources(NODE_PACKAGES):
        for statement in ast.walk(ast.parse(path.read_text())):
            if isinstance(statement, ast.ImportFrom) and statement.module:
                names = {statement.module, *(f"{statement.module}.{alias.name}" for alias in statement.names)}
            elif isinstance(statement, ast.Import):
                names = {alias.name for alias in statement.names}
            else:
                continue
            if names & tool_names:
                importers.append(str(path.relative_to(ROOT)))
    assert importers == []
