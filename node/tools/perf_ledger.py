"""`grouper perf`'s check and report, pure: what the consumers got, per group, and the run's summary.

Rules:
- `Ledger`: per group, a message seen twice is a duplicate, one arriving after a later one of its
  group an order violation; lost = accepted by the node - distinct received, after the consumers
  stayed quiet long enough (node/tools/perf_run.py decides when).
- No sockets, no proton, no clock: numbers in, numbers and text out.
"""

from __future__ import annotations

from dataclasses import dataclass

PERCENTILES = (50, 90, 99, 99.9)


class Ledger:
    """What the consumers got, per group: duplicates and order violations as they arrive."""

    def __init__(self):
        self._seen: dict[str, bytearray] = {}  # group -> one byte per seq
        self._highest: dict[str, int] = {}
        self.received = self.distinct = self.duplicates = self.order_violations = 0

    def record(self, group: str, seq: int) -> None:
        self.received += 1
        seen = self._seen.get(group)
        if seen is None:
            seen = self._seen[group] = bytearray()
        if seq >= len(seen):
            seen.extend(bytes(seq + 1 - len(seen) + len(seen) // 2))  # amortized growth
        if seen[seq]:
            self.duplicates += 1
            return
        seen[seq] = 1
        self.distinct += 1
        highest = self._highest.get(group, -1)
        if seq < highest:
            self.order_violations += 1
        else:
            self._highest[group] = seq

    def lost(self, accepted: int) -> int:
        return max(0, accepted - self.distinct)


def percentile(sorted_values: list, fraction: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


@dataclass
class Outcome:
    sent: int
    accepted: int
    refused: int
    ledger: Ledger
    latencies_ns: list
    send_s: float
    receive_s: float
    errors: list

    @property
    def lost(self) -> int:
        return self.ledger.lost(self.accepted)

    @property
    def clean(self) -> bool:
        return not (self.lost or self.ledger.duplicates or self.ledger.order_violations or self.refused
                    or self.errors)

    def report(self, plan) -> str:
        ledger = self.ledger
        latencies = sorted(self.latencies_ns)
        throughput = ledger.received / self.receive_s if self.receive_s > 0 else 0.0
        lines = [
            f"queue {plan.queue} on {', '.join(plan.nodes)}: {plan.producers} producer(s), {plan.consumers} "
            f"consumer(s), {plan.groups} groups, prefetch {plan.prefetch}, "
            f"{'durable' if plan.durable else 'not durable'}"
            + (f", rate {plan.rate_per_s}/s" if plan.rate_per_s else ""),
            f"sent {self.sent}, accepted {self.accepted}, refused {self.refused} in {self.send_s:.2f} s",
            f"received {ledger.received} in {self.receive_s:.2f} s: {throughput:,.0f} msgs/s",
            "latency ms (send to receive): " + "  ".join(
                f"p{p:g} {percentile(latencies, p / 100) / 1e6:.2f}" for p in PERCENTILES)
            + f"  max {(latencies[-1] if latencies else 0) / 1e6:.2f}",
            f"lost {self.lost}, duplicates {ledger.duplicates}, order violations {ledger.order_violations}",
        ]
        lines += [f"error: {error}" for error in self.errors]
        return "\n".join(lines)
