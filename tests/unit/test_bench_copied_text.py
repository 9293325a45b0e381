"""The prose the benchmark reports copy in lives in docs/benchmarks-method.md between markers: every
name a bench module asks for is there, and a missing one is an error that says where to put it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.report_file import NOTES, copied_text

ROOT = Path(__file__).resolve().parents[2]


def test_every_text_a_bench_module_copies_is_in_the_notes():
    names = {name for path in sorted((ROOT / "bench").glob("*.py"))
             for name in re.findall(r'copied_text\("([\w-]+)"\)', path.read_text())}
    assert {"cluster-analysis", "cluster-method", "run-analysis", "run-method"} <= names
    assert {name: bool(copied_text(name)) for name in names} == {name: True for name in names}


def test_the_copied_text_is_what_stands_between_its_markers_and_nothing_else(tmp_path):
    notes = tmp_path / "notes.md"
    notes.write_text("# notes\n\n<!-- copy: a -->\n## A\n\ntext of a\n<!-- end copy: a -->\n\nafter\n")
    assert copied_text("a", notes) == "## A\n\ntext of a"


def test_a_missing_text_says_which_file_should_hold_it(tmp_path):
    notes = tmp_path / "notes.md"
    notes.write_text("# notes\n")
    with pytest.raises(ValueError, match=re.escape(str(notes))):
        copied_text("a", notes)
    assert NOTES.name == "benchmarks-method.md"
