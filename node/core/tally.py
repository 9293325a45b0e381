"""Latency tallies: cumulative counts under fixed bounds, the shape a Prometheus histogram exports.

Pure and allocation-free per observation (one bisect, two additions). The owner thread observes;
readers take `snapshot()`, a copy, so another thread never sees a half-updated tally.
"""

from __future__ import annotations

import bisect

# milliseconds: a journal fsync (sub-ms on tmpfs, tens of ms on a busy disk) up to a route decision
# that waits for a raft election (seconds)
LATENCY_BOUNDS_MS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0,
                     5000.0, 10000.0)
# milliseconds, for raft route decisions: fine around the 5 ms a decision should take, coarse beyond
DECISION_BOUNDS_MS = (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 10.0, 15.0, 20.0, 25.0,
                      50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0)


class LatencyTally:
    __slots__ = ("bounds_ms", "counts", "count", "sum_ms")

    def __init__(self, bounds_ms: tuple = LATENCY_BOUNDS_MS):
        self.bounds_ms = bounds_ms
        self.counts = [0] * (len(bounds_ms) + 1)  # per bucket, not cumulative; the last is +Inf
        self.count = 0
        self.sum_ms = 0.0

    def observe(self, value_ms: float) -> None:
        self.counts[bisect.bisect_left(self.bounds_ms, value_ms)] += 1
        self.count += 1
        self.sum_ms += value_ms

    def snapshot(self) -> dict:
        """{"buckets": [(upper bound ms or inf, cumulative count)], "count", "sum_ms"}"""
        running = 0
        buckets = []
        for bound, count in zip((*self.bounds_ms, float("inf")), self.counts):
            running += count
            buckets.append((bound, running))
        return {"buckets": buckets, "count": self.count, "sum_ms": self.sum_ms}
