"""A benchmark run's log lines: one line per event, timestamped, printed above the run's progress bar
when one is drawn (bench.run's messages, bench.cluster's phases). Holds the bar's handle while a run
lasts (its main sets and clears PROGRESS); never measures anything."""

from __future__ import annotations

import time

from node.tools.progress import Progress


PROGRESS: Progress | None = None  # main's bar over the phases, which log's lines must not tear


def log(text: str) -> None:
    line = f"{time.strftime('%H:%M:%S')} {text}"
    if PROGRESS is not None:
        PROGRESS.say(line)
    else:
        print(line, flush=True)


def phase_done(phases: set[str], name: str) -> None:
    """Count phase `name` on the bar, if it was one asked for."""
    if PROGRESS is not None and name in phases:
        PROGRESS.advance()
