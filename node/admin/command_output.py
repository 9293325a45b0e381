"""What the management commands print: aligned tables, counted nouns, and `Stayed`, a partial success.

Rules:
- Formatting only: strings in, strings out; printing is the command's.
- `Stayed` is raised by a command that did part of its work after printing what it did; the runner
  (node/admin/commands.py) prints its text on stderr and exits 1.
"""

from __future__ import annotations


class Stayed(Exception):
    """A command that did part of its work: what it did is printed, this says what it did not and why."""


def count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def table(headers: tuple, rows: list[tuple]) -> str:
    cells = [tuple(str(value) for value in row) for row in (headers, *rows)]
    widths = [max(len(row[column]) for row in cells) for column in range(len(headers))]
    return "\n".join("  ".join(value.ljust(width) for value, width in zip(row, widths)).rstrip()
                     for row in cells)
