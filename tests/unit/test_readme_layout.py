"""The README's Layout section names every package and module of the product, bench/ and deploy/, and
each folder of tests/: a module added without a line there fails here, so the map stays whole."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULE_PACKAGES = ("node", "handler", "pipeline", "bench")  # each of their modules is named
FOLDER_PARENTS = ("node", "deploy", "tests")  # each folder of theirs is named, as `name/`


def _layout() -> str:
    text = (ROOT / "README.md").read_text()
    return text[text.index("\n## Layout\n"):]


def _modules() -> list[Path]:
    return [path for package in MODULE_PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
            if path.name != "__init__.py" and "results" not in path.parts]


def _folders() -> list[Path]:
    return [path for parent in FOLDER_PARENTS for path in sorted((ROOT / parent).iterdir())
            if path.is_dir() and not path.name.startswith((".", "_"))]


def test_the_layout_names_every_module_of_node_handler_pipeline_and_bench():
    layout = _layout()
    missing = [str(path.relative_to(ROOT)) for path in _modules()
               if not re.search(rf"(?<![\w/.]){re.escape(path.stem)}\b", layout)]
    assert missing == [], f"README's Layout section has no line for {missing}"


def test_the_layout_names_every_folder_of_node_deploy_and_tests_and_the_top_level_packages():
    layout = _layout()
    missing = [str(path.relative_to(ROOT)) for path in _folders() if f"{path.name}/" not in layout
               and f"{path.name} (" not in layout]
    missing += [name for name in ("node", "handler", "proto", "pipeline", "bench", "deploy", "tests", "docs")
                if f"\n{name}/" not in layout]
    assert missing == [], f"README's Layout section has no line for {missing}"
