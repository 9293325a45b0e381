"""Progress of long work (benchmarks, campaigns, the audit job), drawn for a person watching.

Rules this module keeps:
- The bar goes to stderr and only when stderr is a terminal: logs, pipes and CI get the work's own
  output alone, byte for byte as without a bar.
- The work's own lines still go to stdout; while a bar is drawn they go through `Progress.say`, which
  clears the bar, prints the line and draws the bar again below it, so the two never interleave.
- The estimate of the time left is tqdm's: the rate so far over what is left. Work whose steps differ
  in size counts in a unit that makes them comparable (messages, not rows) where it can.
"""

from __future__ import annotations

import sys

from tqdm import tqdm


class Progress:
    """A bar over `total` units of `unit`, or nothing at all when stderr is not a terminal."""

    def __init__(self, total: float, description: str, unit: str, *, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.shown = bool(getattr(self.stream, "isatty", lambda: False)())
        self._bar = tqdm(total=total, desc=description, unit=unit, file=self.stream, disable=not self.shown,
                         dynamic_ncols=True, leave=False,
                         mininterval=0, miniters=1,  # work advances rarely (a round, a row): draw every step
                         unit_scale=unit in ("msg", "task"),  # counts in the thousands read as 12.3k msg
                         bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} {unit} "
                                    "[{elapsed} so far, ~{remaining} left{postfix}]")

    def advance(self, units: float = 1) -> None:
        self._bar.update(units)

    def note(self, text: str) -> None:
        """What is happening now, shown after the estimate (e.g. the phase, or a stage's tasks)."""
        self._bar.set_postfix_str(text, refresh=True)

    def say(self, text: str) -> None:
        """Print a line of the work's own output to stdout without tearing the bar."""
        if self.shown:
            self._bar.write(text, file=sys.stdout)
            sys.stdout.flush()
        else:
            print(text, flush=True)

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
