"""No file of the tree can stand in for a module of the standard library or of a dependency.

A directory that comes first on sys.path hides every module of the same name further on: bench/profile.py,
first on sys.path once tests/drills/test_soak.py had put bench/ there at import, hid the standard library's
`profile`, so pyspark's `import cProfile` failed and the README's test command collected nothing in a
fresh virtual environment (issue 25; a machine where pytest-benchmark had already imported cProfile hid
the fault). Two rules keep it from coming back:

- no top-level module or package in a directory that can come first on sys.path has the name of a
  standard-library module (`sys.stdlib_module_names`) or of an installed distribution's top-level module
  (`importlib.metadata.packages_distributions()`), the root's own packages of grouper excepted;
- no module under tests/ or bench/ edits sys.path when it is imported (a function that does, run only
  when called, as bench/outbound_records.py's `--root`, is allowed).

A directory can come first on sys.path when a process starts from it: the repository root (`python -m`,
and pytest's rootdir and `pythonpath`), a directory holding a script run by its path (`python3
deploy/docker/build.py` puts deploy/docker first) and a directory pytest collects test modules from
(it puts tests/unit first, as tests/unit is not a package). A package with neither scripts nor test
modules (node/core, pipeline) is reached only through its package's name: node/core/dispatch/queue.py is
`node.core.dispatch.queue` and hides nothing.
"""

from __future__ import annotations

import ast
import os
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OWN_DISTRIBUTION = "grouper"
SKIPPED_DIRECTORIES = {"__pycache__", "node_modules", "build", "dist"}  # made by tools, git-ignored
SCRIPT_GUARD = '__name__ == "__main__"'
SYS_PATH_EDITS = {"insert", "append", "extend", "remove", "pop", "clear", "__setitem__", "__delitem__"}


def skipped(parent: str, name: str) -> bool:
    """Hidden and tool-made directories, and /data/ (`grouper user add`'s default data directory)."""
    return (name.startswith(".") or name in SKIPPED_DIRECTORIES or name.endswith(".egg-info")
            or (parent == str(ROOT) and name == "data"))


def walk(top: Path):
    """(directory, file names) for top and every directory under it, skipped ones left out."""
    for directory, children, files in os.walk(top):
        children[:] = sorted(child for child in children if not skipped(directory, child))
        yield Path(directory), files


def source_directories() -> list[Path]:
    """The root and every directory of the tree that holds Python files."""
    return [ROOT] + [directory for directory, files in walk(ROOT)
                     if directory != ROOT and any(name.endswith(".py") for name in files)]


def can_come_first_on_sys_path(directory: Path) -> bool:
    if directory == ROOT or not (directory / "__init__.py").exists():
        return True
    return any(path.name.startswith("test_") or path.name == "conftest.py" or SCRIPT_GUARD in path.read_text()
               for path in directory.glob("*.py"))


def top_level_names(directory: Path) -> dict[str, Path]:
    """The modules and packages `import <name>` finds in the directory (a directory without __init__.py
    is a namespace portion, which any module or package of the name elsewhere on sys.path beats)."""
    names = {path.stem: path for path in directory.glob("*.py")}
    names |= {path.name: path for path in directory.iterdir() if (path / "__init__.py").is_file()}
    return names


def names_taken_elsewhere() -> dict[str, str]:
    """name -> whose it is: the standard library's, or the installed distributions' owning it."""
    taken = {name: "the standard library" for name in sys.stdlib_module_names}
    for name, distributions in metadata.packages_distributions().items():
        taken.setdefault(name, "installed " + ", ".join(sorted(set(distributions))))
    return taken


def own_top_level_names() -> set[str]:
    """The root's packages that grouper's own distribution installs (node, handler, ...): not stand-ins."""
    return {name for name, distributions in metadata.packages_distributions().items()
            if OWN_DISTRIBUTION in distributions}


def collisions() -> list[str]:
    taken, own = names_taken_elsewhere(), own_top_level_names()
    found = []
    for directory in filter(can_come_first_on_sys_path, source_directories()):
        for name, path in sorted(top_level_names(directory).items()):
            if name in taken and not (directory == ROOT and name in own):
                found.append(f"{path.relative_to(ROOT)} hides `{name}` of {taken[name]} when "
                             f"{directory.relative_to(ROOT) or '.'}/ is first on sys.path: rename it")
    return found


def module_level_statements(body: list[ast.stmt]):
    """The statements that run when the module is imported: function bodies left out, class bodies and
    the blocks of if/try/with/for/while at module level kept."""
    for statement in body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        yield statement
        for name in ("body", "orelse", "finalbody", "handlers"):
            for child in getattr(statement, name, None) or []:
                yield from module_level_statements(child.body if isinstance(child, ast.ExceptHandler) else [child])


def is_sys_path(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
            and node.value.id == "sys")


def walk_run_now(node: ast.AST):
    """The nodes of an expression or a statement's own line that run when it does: not a lambda's body,
    nor a block's statements (module_level_statements yields those apart)."""
    yield node
    for name, value in ast.iter_fields(node):
        if name in ("body", "orelse", "finalbody", "handlers") and isinstance(node, ast.stmt) \
                or isinstance(node, ast.Lambda):
            continue
        for child in value if isinstance(value, list) else [value]:
            if isinstance(child, ast.AST):
                yield from walk_run_now(child)


def edits_sys_path(statement: ast.stmt) -> bool:
    for node in walk_run_now(statement):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and is_sys_path(node.func.value) \
                and node.func.attr in SYS_PATH_EDITS:
            return True
        targets = (node.targets if isinstance(node, (ast.Assign, ast.Delete))
                   else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
        if any(is_sys_path(target) or isinstance(target, ast.Subscript) and is_sys_path(target.value)
               for target in targets):
            return True
    return False


def sys_path_edits_at_import(paths) -> list[str]:
    found = []
    for path in paths:
        tree = ast.parse(path.read_text(), str(path))
        for statement in module_level_statements(tree.body):
            if edits_sys_path(statement):
                found.append(f"{path.relative_to(ROOT)}:{statement.lineno} edits sys.path at import: import "
                             "from the repository root instead (`from bench import x`, `from tests.x import y`)")
    return found


def test_no_module_of_the_tree_hides_a_standard_library_or_installed_module():
    assert collisions() == []


def test_no_test_or_bench_module_edits_sys_path_when_imported():
    paths = [directory / name for top in ("tests", "bench") for directory, files in walk(ROOT / top)
             for name in sorted(files) if name.endswith(".py")]

    assert sys_path_edits_at_import(paths) == []


def test_the_directories_checked_include_every_one_a_process_starts_from():
    checked = {str(path.relative_to(ROOT)) for path in source_directories() if can_come_first_on_sys_path(path)}

    assert {".", "bench", "tests/unit", "tests/drills", "deploy/docker", "deploy/k8s-secrets"} <= checked
    assert "node/core" not in checked  # reached only as node.core: its queue.py hides nothing


def test_a_module_named_after_the_standard_library_in_a_checked_directory_is_found(tmp_path, monkeypatch):
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "profile.py").write_text("")
    (tmp_path / "tools" / "pipes_of_ours.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)

    assert collisions() == [f"tools/profile.py hides `profile` of the standard library when tools/ is first on "
                            "sys.path: rename it"]


def test_an_edit_of_sys_path_is_found_at_module_level_and_not_in_a_function(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    module = tmp_path / "test_shadow.py"
    module.write_text("import sys\n"
                      "def main():\n    sys.path.insert(0, 'x')\n"
                      "if True:\n    sys.path.insert(0, 'bench')\n"
                      "sys.path[:0] = ['y']\n"
                      "sys.path += ['z']\n")

    assert sys_path_edits_at_import([module]) == [
        f"test_shadow.py:{line} edits sys.path at import: import from the repository root instead "
        "(`from bench import x`, `from tests.x import y`)" for line in (5, 6, 7)]
