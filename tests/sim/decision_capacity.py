"""How many new-group decisions per second S raft groups sustain: a deterministic queueing model in logical time.

One raft group decides at most `capacity_per_s` new groups per second with proposals batched
(docs/benchmarks.md, row c: about 7,000/s on this machine; the model takes it as a parameter and
does not explain it). The model:
- new groups arrive at `offered_per_s`, spread evenly over each millisecond (whole decisions, the
  fractions carried), each a distinct (queue, group) on one of `queues_count` queues, proposed by
  one of three nodes in turn;
- each group waits in its shard's queue: `node/core/cluster/shards.py`'s shard_of picks the shard;
- every millisecond each shard's leader commits one batched claim of its oldest waiting groups, as
  many as its capacity allows (capacity_per_s / 1000 per ms, the fractions carried), to that
  shard's real RouteTable (handler/route_table.py), which must answer every group with a node.
What it leaves out: raft's own latency (a commit takes the millisecond it is made in), a slower
shard (every shard has the same capacity), leader loss (tests/sim/sharding.py simulates that).
Measures: decisions per second over the run, the backlog (groups waiting) at its middle and its end,
and the wait from arrival to commit (p50, p99). A backlog that doubles from the middle to the end
(and holds over 1% of the arrivals) grows without bound; one that stays small is sustained.

Run the sweep documented in docs/cluster-ceiling.md: python3 -m tests.sim.decision_capacity
"""

from __future__ import annotations

import collections
import random
import sys
from dataclasses import dataclass

from handler.placement import PLACEMENT_LOCAL
from handler.route_table import RouteTable
from node.core.cluster.shards import shard_of

CAPACITY_PER_S_MEASURED = 7_000  # docs/benchmarks.md row c: new-group decisions/s of one raft group
NODES = ("n1", "n2", "n3")


@dataclass(frozen=True)
class CapacityResult:
    shard_count: int
    capacity_per_s: int
    offered_per_s: int
    duration_ms: int
    decided: int
    backlog_middle: int  # groups waiting for a decision at duration_ms / 2
    backlog_end: int
    wait_p50_ms: int
    wait_p99_ms: int
    busiest_shard_share: float  # of all arrivals, the busiest shard's part (1/S if even)

    @property
    def decided_per_s(self) -> float:
        return self.decided * 1000 / self.duration_ms

    @property
    def grows(self) -> bool:
        """The backlog grows without bound: it (at least nearly) doubled from the middle to the end, and more
        than 1% of the run's arrivals wait at its end (below that it is the jitter of whole decisions)."""
        arrivals = self.offered_per_s * self.duration_ms // 1000
        return self.backlog_end >= 1.8 * self.backlog_middle and self.backlog_end > arrivals / 100


def run(shard_count: int, offered_per_s: int, *, capacity_per_s: int = CAPACITY_PER_S_MEASURED,
        duration_ms: int = 2000, queues_count: int = 4, seed: int = 1) -> CapacityResult:
    if duration_ms < 2 or duration_ms % 2:
        raise ValueError(f"duration_ms must be an even number of at least 2, got {duration_ms}")
    rng = random.Random(seed)
    queues = [f"q{index}" for index in range(queues_count)]
    tables = [RouteTable(routes_max=offered_per_s * duration_ms // 1000 + 1) for _ in range(shard_count)]
    waiting: list[collections.deque] = [collections.deque() for _ in range(shard_count)]  # (queue, group, arrived_ms)
    arrivals_by_shard = [0] * shard_count
    waits_ms: list[int] = []
    arrival_credit = 0  # decisions x 1000, carried between milliseconds
    commit_credit = [0] * shard_count
    next_group = 0
    backlog_middle = 0
    for now_ms in range(duration_ms):
        arrival_credit += offered_per_s
        while arrival_credit >= 1000:
            arrival_credit -= 1000
            queue, group = rng.choice(queues), f"g{next_group}"
            next_group += 1
            shard = shard_of(queue, group, shard_count)
            arrivals_by_shard[shard] += 1
            waiting[shard].append((queue, group, now_ms))
        for shard in range(shard_count):
            # an idle leader banks no capacity: a batch takes at most one millisecond's worth
            commit_credit[shard] = min(commit_credit[shard] + capacity_per_s, capacity_per_s + 999)
            batch = []
            while waiting[shard] and commit_credit[shard] >= 1000:
                commit_credit[shard] -= 1000
                batch.append(waiting[shard].popleft())
            if not waiting[shard]:
                commit_credit[shard] = min(commit_credit[shard], 999)
            if batch:
                nodes = tables[shard].claim([[queue, group] for queue, group, _ in batch], NODES[now_ms % 3],
                                            now_ms, PLACEMENT_LOCAL)
                if None in nodes:
                    raise AssertionError(f"shard {shard} refused a new group: {batch[nodes.index(None)]}")
                waits_ms.extend(now_ms - arrived_ms for _, _, arrived_ms in batch)
        if now_ms + 1 == duration_ms // 2:
            backlog_middle = sum(len(queue) for queue in waiting)
    waits_ms.sort()
    arrived = sum(arrivals_by_shard)
    return CapacityResult(
        shard_count=shard_count, capacity_per_s=capacity_per_s, offered_per_s=offered_per_s,
        duration_ms=duration_ms, decided=len(waits_ms), backlog_middle=backlog_middle,
        backlog_end=sum(len(queue) for queue in waiting),
        wait_p50_ms=_percentile(waits_ms, 0.50), wait_p99_ms=_percentile(waits_ms, 0.99),
        busiest_shard_share=max(arrivals_by_shard) / arrived if arrived else 0.0)


def _percentile(sorted_values: list[int], fraction: float) -> int:
    if not sorted_values:
        return 0
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


def sweep(shard_counts=(1, 2, 4, 8), load_ratios=(0.5, 0.9, 1.1, 2.0), *,
          capacity_per_s: int = CAPACITY_PER_S_MEASURED, duration_ms: int = 10_000, seed: int = 1) -> list[CapacityResult]:
    """Each shard count at each offered load, as a fraction of S x capacity."""
    return [run(shard_count, int(ratio * shard_count * capacity_per_s), capacity_per_s=capacity_per_s,
                duration_ms=duration_ms, seed=seed)
            for shard_count in shard_counts for ratio in load_ratios]


def table(results: list[CapacityResult]) -> str:
    lines = ["| shards S | offered /s | offered / (S x C) | decided /s | backlog at half time | backlog at end "
             "| wait p50 ms | wait p99 ms | busiest shard's share |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for result in results:
        ratio = result.offered_per_s / (result.shard_count * result.capacity_per_s)
        lines.append(f"| {result.shard_count} | {result.offered_per_s:,} | {ratio:.2f} | {result.decided_per_s:,.0f} "
                     f"| {result.backlog_middle:,} | {result.backlog_end:,} | {result.wait_p50_ms:,} "
                     f"| {result.wait_p99_ms:,} | {result.busiest_shard_share:.3f} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    duration_ms = int(argv[0]) if argv else 10_000
    print(f"capacity C = {CAPACITY_PER_S_MEASURED:,} decisions/s per shard, {duration_ms:,} ms of logical time, seed 1")
    print(table(sweep(duration_ms=duration_ms)))
    offered_per_s = int(0.9 * 4 * CAPACITY_PER_S_MEASURED)
    print(f"\nthe same offered load, {offered_per_s:,} new groups/s, on 1, 2, 4 and 8 shards:")
    print(table([run(shard_count, offered_per_s, duration_ms=duration_ms) for shard_count in (1, 2, 4, 8)]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
