"""Decision timing: the raft part of each route decision, timed in the raft member.

Owns a tally of the time from a claim's arrival in the member to its route being applied there, which
the member adds to its status ("decision_latency"): the node times the whole decision from its own
engine loop, which also counts the waits of a busy node's loop; the difference says which side a slow
decision spent its time on. At most CLAIMS_TIMED_MAX claims are timed at once; the rest pass untimed (a
leaderless cluster piles them up). Threads: claims arrive on the member channel's reader thread and
routes are applied on pysyncobj's tick thread, so every method takes the lock, as a status read does.
"""

from __future__ import annotations

import threading
import time

from node.core.cluster.feed import ROUTES, SNAPSHOT
from node.core.tally import DECISION_BOUNDS_MS, LatencyTally

CLAIMS_TIMED_MAX = 100_000  # claims timed at once; the rest pass untimed (a leaderless cluster piles them up)


class DecisionTiming:
    def __init__(self):
        self._claimed_ns: dict[tuple, int] = {}  # (queue, group) -> when its claim arrived (monotonic ns)
        self._latency = LatencyTally(DECISION_BOUNDS_MS)
        self._lock = threading.Lock()

    def claimed(self, keys) -> None:
        claimed_ns = time.monotonic_ns()
        with self._lock:
            if len(self._claimed_ns) < CLAIMS_TIMED_MAX:
                for queue, group in keys:
                    self._claimed_ns.setdefault((queue, group), claimed_ns)

    def failed(self, keys) -> None:
        with self._lock:
            for queue, group in keys:
                self._claimed_ns.pop((queue, group), None)

    def applied(self, kind, payload) -> None:
        """A feed entry the replica applied: decided routes end their timing; a snapshot ends every one."""
        if kind == ROUTES and self._claimed_ns:
            applied_ns = time.monotonic_ns()
            with self._lock:
                claimed_ns, tally = self._claimed_ns, self._latency
                for entry in payload:
                    since_ns = claimed_ns.pop((entry[0], entry[1]), None)
                    if since_ns is not None and entry[2] is not None:
                        tally.observe((applied_ns - since_ns) / 1e6)
        elif kind == SNAPSHOT:
            with self._lock:
                self._claimed_ns.clear()  # caught up on by a snapshot: no decision of theirs is seen here

    def snapshot(self) -> dict:
        with self._lock:
            return self._latency.snapshot()
