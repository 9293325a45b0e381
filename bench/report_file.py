"""docs/benchmarks.md is written by several benchmark scripts, each owning its own "## " sections.

Rules: a script replaces only the sections it owns and keeps every other one where it was, so
running one benchmark never erases another's numbers.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
NOTES = REPO_ROOT / "docs" / "benchmarks-method.md"  # the prose the reports copy in, between markers


def commit() -> str:
    """The checkout's short HEAD, which every report names ("unknown" outside a git checkout)."""
    return subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip() or "unknown"


def _sections(lines: list[str]) -> list[tuple[str, int, int]]:
    """(heading, start, end) of each "## " section; a section runs to the next "## " heading."""
    starts = [i for i, line in enumerate(lines) if line.startswith("## ")]
    return [(lines[start].strip(), start, ends) for start, ends in zip(starts, [*starts[1:], len(lines)])]


def write_section(out: Path, heading: str, section: str) -> None:
    """Replace section `heading` of `out` with `section` (which starts with that heading), or append it."""
    text = out.read_text() if out.exists() else ""
    lines = text.splitlines()
    found = [(start, end) for title, start, end in _sections(lines) if title == heading.strip()]
    if not found:
        new = text.rstrip("\n") + ("\n\n" if text else "") + section
    else:
        start, end = found[0]
        new = "\n".join([*lines[:start], *section.rstrip("\n").splitlines(), *([""] if end < len(lines) else []),
                         *lines[end:]])
    out.write_text(new.rstrip("\n") + "\n")


def write_keeping_others(out: Path, rendered: str) -> None:
    """Write `rendered` as the file, followed by the sections of the old file it does not contain."""
    owned = {title for title, _, _ in _sections(rendered.splitlines())}
    old = out.read_text().splitlines() if out.exists() else []
    kept = ["\n".join(old[start:end]).rstrip("\n") for title, start, end in _sections(old) if title not in owned]
    out.write_text("\n\n".join([rendered.rstrip("\n"), *kept]).rstrip("\n") + "\n")


def copied_text(name: str, path: Path = NOTES) -> str:
    """The hand-written text between `<!-- copy: name -->` and `<!-- end copy: name -->` in `path`
    (docs/benchmarks-method.md), which a report copies in as it stands."""
    text = path.read_text()
    begin, end = f"<!-- copy: {name} -->", f"<!-- end copy: {name} -->"
    if begin not in text or end not in text:
        raise ValueError(f"{path} has no {begin} ... {end}: put the text a report copies there")
    return text[text.index(begin) + len(begin):text.index(end)].strip()
