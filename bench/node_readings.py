"""What the cluster benchmarks read from running nodes: the raft decision histograms of /metrics and
their differences and quantiles, how long a node's threads waited for a CPU, its CPU when idle, the
leader elections its log shows, the routes each owns, and percentiles of recorded times. Reads
/proc, /metrics and the nodes' output; changes nothing on a node."""

from __future__ import annotations

import datetime
import time
import urllib.request
from pathlib import Path

from bench.cluster_nodes import Cluster, NodeProcess

METRICS_TIMEOUT_S = 15.0  # one read of a node's /metrics
DECISION_BUCKET_METRIC = "grouper_raft_decision_latency_seconds_bucket"
# the raft part alone, as the node's raft member times it (claim received -> route applied there)
MEMBER_DECISION_BUCKET_METRIC = "grouper_raft_member_decision_latency_seconds_bucket"
DECISION_TARGET_MS = 5.0
IDLE_MEASURE_S = 5.0  # CPU of idle nodes (raft heartbeats, timers), the cluster's fixed cost
LEADER_LOG_LINE = "this node is now the raft leader"


def raft_decisions(node: NodeProcess, metric: str = DECISION_BUCKET_METRIC) -> list[tuple[float, int]]:
    """A raft decision histogram of the node's /metrics: [(upper bound ms, cumulative count)]."""
    with urllib.request.urlopen(f"http://{node.http_address}/metrics", timeout=METRICS_TIMEOUT_S) as reply:
        text = reply.read().decode()
    buckets = []
    for line in text.splitlines():
        if line.startswith(metric):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float("inf") if bound == "+Inf" else float(bound) * 1000,
                            int(float(line.rsplit(" ", 1)[1]))))
    return buckets


def cpu_wait_ns(node: NodeProcess) -> int:
    """How long the node process's threads have waited, runnable, for a CPU (Linux schedstat)."""
    total = 0
    for task in Path(f"/proc/{node.pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[1])
        except (OSError, IndexError, ValueError):
            pass  # a thread that ended meanwhile
    return total


def decision_delta(before: list, after: list) -> list[tuple[float, int]]:
    """Per-bucket counts (not cumulative) of the decisions between two readings of one node."""
    counts, previous = [], 0
    for (bound, total_after), (_, total_before) in zip(after, before):
        cumulative = total_after - total_before
        counts.append((bound, cumulative - previous))
        previous = cumulative
    return counts


def decision_summary(per_node: list[list[tuple[float, int]]]) -> dict:
    """Decisions of several nodes together: count, p50 and p99 interpolated within their buckets,
    and the share decided within DECISION_TARGET_MS (exact: it is a bucket bound)."""
    merged: dict[float, int] = {}
    for counts in per_node:
        for bound, count in counts:
            merged[bound] = merged.get(bound, 0) + count
    buckets = sorted(merged.items())
    total = sum(count for _, count in buckets)
    if not total:
        return {"count": 0, "p50_ms": None, "p99_ms": None, "within_target_pct": None}

    def quantile(fraction: float) -> float:
        rank, seen, lower = fraction * total, 0, 0.0
        for bound, count in buckets:
            if count and seen + count >= rank:
                if bound == float("inf"):
                    return lower  # beyond the last bound: the bound is all that is known
                return lower + (bound - lower) * (rank - seen) / count
            seen += count
            lower = bound if bound != float("inf") else lower
        return lower

    within = sum(count for bound, count in buckets if bound <= DECISION_TARGET_MS)
    return {"count": total, "p50_ms": round(quantile(0.5), 2), "p99_ms": round(quantile(0.99), 2),
            "within_target_pct": round(within / total * 100, 2)}


def decision_readings(nodes: list[NodeProcess]) -> list:
    """Per node: its whole-decision and its member's raft-part histograms."""
    return [(raft_decisions(node), raft_decisions(node, MEMBER_DECISION_BUCKET_METRIC)) for node in nodes]


def decisions_since(nodes: list[NodeProcess], before: list) -> dict:
    """decision_summary of the decisions the nodes timed since their readings `before` (decision_readings),
    with the raft part their members timed as "member"."""
    after = decision_readings(nodes)
    summary = decision_summary([decision_delta(earlier[0], now[0]) for earlier, now in zip(before, after)])
    summary["member"] = decision_summary([decision_delta(earlier[1], now[1]) for earlier, now in zip(before, after)])
    return summary


def percentiles_ms(values_ns) -> dict:
    values = sorted(values_ns)
    if not values:
        return {"count": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    pick = lambda fraction: values[min(len(values) - 1, int(fraction * len(values)))] / 1e6  # noqa: E731
    return {"count": len(values), "p50_ms": round(pick(0.5), 2), "p99_ms": round(pick(0.99), 2),
            "max_ms": round(values[-1] / 1e6, 2)}


def idle_cpu_pct(nodes: list[NodeProcess]) -> list[float]:
    """Percent of one core each node uses with no clients at all."""
    before = [node.cpu_seconds() for node in nodes]
    time.sleep(IDLE_MEASURE_S)
    return [round((node.cpu_seconds() - start) / IDLE_MEASURE_S * 100, 1) for node, start in zip(nodes, before)]


def leader_since(node: NodeProcess, since_s: float) -> list[float]:
    """Wall-clock times (from the node's log, millisecond resolution) it became leader after `since_s`."""
    times = []
    for line in list(node.output):
        if LEADER_LOG_LINE in line:
            try:
                stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            except ValueError:
                continue
            if stamp >= since_s:
                times.append(stamp)
    return times


def routes_by_node(cluster: Cluster) -> list:
    """Routes each node owns, in node order (every queue's: the rows' queues differ only by name)."""
    status = cluster.status() or {}
    owned = {member.get("node"): member.get("routes") for member in status.get("members", [])}
    return [owned.get(node_id) for node_id in cluster.node_ids]
