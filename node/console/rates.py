"""Message rates for the console: samples of the cluster's counters, kept a few minutes (issue 32).

Rules:
- Pure: no clock, no threads, no I/O. The console records a sample each time it answers a view with
  the members' counters (their `enqueued_total`, `delivered_total` per queue, its own refusal counts);
  `now_ms` is an argument. The caller holds a lock around it (HTTP requests come on many threads).
- Rates are the server's, not the page's: any page, opened or reloaded at any moment, shows the rate
  between the two newest samples the node kept, and a chart of the last HISTORY_MS. The first console
  took the rate between its own two polls, so every freshly opened page showed the In/s and Out/s
  columns empty (issue 32: "empty while messages flowed").
- Bounded: at most one sample per SAMPLE_SPACING_MIN_MS (a sample asked sooner is not kept), none older
  than HISTORY_MS, so at most SAMPLES_MAX are held whatever the number of pages polling.
- A counter lower than in the sample before means its node restarted and counts from zero again: the
  increase is the new value. A counter absent from the sample before (a new queue, a member that did not
  answer) has no rate until the next sample.
"""

from __future__ import annotations

from collections import deque

HISTORY_MS = 10 * 60_000  # what the overview's charts show
SAMPLE_SPACING_MIN_MS = 1_000  # samples asked for closer than this are not kept
SAMPLES_MAX = HISTORY_MS // SAMPLE_SPACING_MIN_MS + 1


def _increase(new: int, old: int) -> int:
    return new - old if new >= old else new  # lower: its node restarted and counts from zero


class RateHistory:
    def __init__(self):
        self._samples: deque[tuple[int, dict]] = deque(maxlen=SAMPLES_MAX)  # (at_ms, {key: (a, b)})

    def record(self, now_ms: int, totals: dict) -> bool:
        """Keep `totals` ({key: (first counter, second counter)}, e.g. (node, queue): (in, out)) as the
        sample at `now_ms`, unless the newest is under SAMPLE_SPACING_MIN_MS old; whether it was kept."""
        samples = self._samples
        if samples and now_ms - samples[-1][0] < SAMPLE_SPACING_MIN_MS:
            return False
        samples.append((now_ms, dict(totals)))
        while samples and now_ms - samples[0][0] > HISTORY_MS:
            samples.popleft()
        return True

    def rates(self) -> dict:
        """{key: (first per second, second per second)} between the two newest samples."""
        if len(self._samples) < 2:
            return {}
        (before_ms, before), (now_ms, now) = self._samples[-2], self._samples[-1]
        return {key: _per_second(value, before[key], now_ms - before_ms) for key, value in now.items() if key in before}

    def series(self, now_ms: int, keep=lambda key: True) -> list[dict]:
        """[{"age_ms", "first_per_s", "second_per_s"}] of every pair of consecutive samples, oldest first,
        summed over the keys `keep` accepts; age_ms: how long before `now_ms` the pair's later sample was."""
        points = []
        samples = list(self._samples)
        for (before_ms, before), (after_ms, after) in zip(samples, samples[1:]):
            first = second = 0.0
            for key, value in after.items():
                if key in before and keep(key):
                    rate = _per_second(value, before[key], after_ms - before_ms)
                    first, second = first + rate[0], second + rate[1]
            points.append({"age_ms": now_ms - after_ms, "first_per_s": round(first, 2), "second_per_s": round(second, 2)})
        return points

    def increase(self, key) -> tuple[int, int]:
        """How much `key`'s counters grew over the history kept (0, 0 when not in its oldest sample)."""
        if not self._samples:
            return 0, 0
        oldest, newest = self._samples[0][1], self._samples[-1][1]
        if key not in oldest or key not in newest:
            return 0, 0
        return _increase(newest[key][0], oldest[key][0]), _increase(newest[key][1], oldest[key][1])

    def keys(self) -> set:
        return set(self._samples[-1][1]) if self._samples else set()


def _per_second(now: tuple, before: tuple, span_ms: int) -> tuple[float, float]:
    return (round(_increase(now[0], before[0]) * 1000 / span_ms, 2),
            round(_increase(now[1], before[1]) * 1000 / span_ms, 2))
