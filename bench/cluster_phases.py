"""The cluster benchmark's phases that move load: `phase` (wait for a quiet machine, run, record load,
CPU steal and raft elections), the throughput rows on one node and on 3 nodes, balanced against
local placement, and the full-load stability run. Each phase returns plain numbers for the report;
a failed phase is a result ("failed"), never an exception out of the run."""

from __future__ import annotations

import time
from pathlib import Path

from bench.cluster_nodes import Cluster, NodeProcess
from bench.machine import LoadGate, load_1m, steal_jiffies, steal_pct
from bench.node_readings import idle_cpu_pct, leader_since, routes_by_node
from bench.phase_log import log
from bench.workloads import (CEILING_MESSAGES_MAX, LOCAL_LAYOUT, REMOTE_LAYOUT, SINGLE_LAYOUT, WARMUP_MESSAGES,
                             BackgroundLoad, FlowRow, measure_flow)


STABILITY_S = 600.0  # the full-load run in which no raft election may happen


def phase(gate: LoadGate, name: str, run, cluster: "Cluster | None" = None) -> dict:
    """Wait for a quiet machine, run, record the load and (in a cluster) the raft elections the
    node logs show from the start of the wait to the end of the phase: a stable cluster has none
    but those the phase causes itself."""
    window_start_s = time.time()
    load = gate.wait(name)
    started, steal_before = time.monotonic(), steal_jiffies()
    try:
        result = run()
    except Exception as error:  # a failed phase is reported, the run goes on
        log(f"[{name}] FAILED: {type(error).__name__}: {error}")
        result = {"failed": f"{type(error).__name__}: {error}"}
    extra = {}
    if cluster is not None:
        extra["elections"] = sum(len(leader_since(node, window_start_s)) for node in cluster.nodes)
        if extra["elections"]:
            log(f"[{name}] {extra['elections']} raft leader elections during the phase (its wait included)")
    extra["steal_pct"] = steal_pct(steal_before)
    return {**result, "load_start": load["load_start"], "load_end": load_1m(), "load_waited_s": load["waited_s"],
            "load_quiet": load["quiet"], "phase_s": round(time.monotonic() - started, 1), **extra}


def flow_summary(result: dict) -> str:
    return (f"{result['throughput_per_s']:.0f} msgs/s, broker {result['broker_cpu_us_per_msg']:.0f} us/msg "
            f"(per node {result['node_cpu_us_per_msg']}), p50 {result['latency_p50_ms']:.0f} ms, "
            f"p99 {result['latency_p99_ms']:.0f} ms, lost {result['lost']}, dup {result['duplicates']}, "
            f"split {result['groups_split']} {result['errors'] or ''}")


def run_single(work_dir: Path, config_path: Path, messages: int, gate: LoadGate, report: dict) -> dict:
    node = NodeProcess("single", work_dir, config_path).start()
    log(f"[single] node ready: {node.url}")
    try:
        report["idle_cpu_pct_single"] = idle_cpu_pct([node])[0]
        warm = measure_flow([node], FlowRow("warmup", "warm-up", "warmup", 0, SINGLE_LAYOUT,
                                            WARMUP_MESSAGES), work_dir / "rows" / "single-warmup")
        log(f"[single] warm-up: {warm['throughput_per_s']:.0f} msgs/s {warm['errors'] or ''}")
        row = FlowRow("a", "1 node, producer and 4 consumers on it", "a", 0, SINGLE_LAYOUT, messages)
        result = phase(gate, "a", lambda: measure_flow([node], row, work_dir / "rows" / "a"))
        log(f"[a] {flow_summary(result)}" if "failed" not in result else "[a] failed")
        return result
    finally:
        node.stop()


def run_flows(cluster: Cluster, work_dir: Path, messages: int, gate: LoadGate) -> list[dict]:
    nodes = cluster.nodes
    everywhere, remote = LOCAL_LAYOUT, REMOTE_LAYOUT
    warm = measure_flow(nodes, FlowRow("warmup", "warm-up", "warmup", 0, remote, WARMUP_MESSAGES),
                        work_dir / "rows" / "cluster-warmup",
                        before_go=lambda: cluster.wait_consumers("warmup", remote))
    log(f"[cluster] warm-up (forwarded): {warm['throughput_per_s']:.0f} msgs/s {warm['errors'] or ''}")
    rows = [FlowRow("b1", "3 nodes, producer on node 1; consumers: 4 on node 1, 2 on node 2, 2 on node 3 "
                    "(placement balanced: groups spread by groups per consumer, so about half are forwarded)",
                    "b1", 0, everywhere, messages),
            FlowRow("b2", "3 nodes, producer on node 1; consumers: 2 on node 2, 2 on node 3 (all forwarded)", "b2", 0,
                    remote, messages)]
    ceiling = min(messages, CEILING_MESSAGES_MAX)
    rows.append(FlowRow("c", f"decision ceiling: as (b1), but each message's group drawn from {ceiling:,} groups, "
                        "so most messages open a new group and wait for its route decision", "c", 0, everywhere,
                        ceiling, groups=ceiling))
    results = []
    for row in rows:
        result = phase(gate, row.key, lambda row=row: measure_flow(
            nodes, row, work_dir / "rows" / row.key,
            before_go=lambda: cluster.wait_consumers(row.queue, row.consumers_by_node)), cluster)
        if "failed" not in result:
            result["leader_node"] = cluster.leader() + 1
            result["routes_by_node"] = routes_by_node(cluster)  # where placement put the row's groups (all queues)
            log(f"[{row.key}] {flow_summary(result)}; leader node {result['leader_node']}")
        results.append(result)
    return results


def run_local_placement(work_dir: Path, config_path: Path, messages: int, gate: LoadGate) -> dict:
    """Row (b1) again on a fresh cluster whose nodes place new groups locally (`--placement local`),
    to set against balanced placement's (b1)."""
    cluster = Cluster(work_dir / "placement-local", config_path, args=("--placement", "local"))
    try:
        cluster.start()
        measure_flow(cluster.nodes, FlowRow("warmup", "warm-up", "warmup", 0, REMOTE_LAYOUT, WARMUP_MESSAGES),
                     work_dir / "rows" / "local-warmup",
                     before_go=lambda: cluster.wait_consumers("warmup", REMOTE_LAYOUT))
        row = FlowRow("b1-local", "as (b1), but every node started with `--placement local`", "b1", 0, LOCAL_LAYOUT,
                      messages)
        result = phase(gate, row.key, lambda: measure_flow(
            cluster.nodes, row, work_dir / "rows" / row.key,
            before_go=lambda: cluster.wait_consumers(row.queue, row.consumers_by_node)), cluster)
        if "failed" not in result:
            log(f"[{row.key}] {flow_summary(result)}")
        return result
    finally:
        cluster.stop()


def run_stability(cluster: Cluster, work_dir: Path, seconds: float) -> dict:
    """Full load through every node for `seconds`: how many raft elections and term changes happen
    with nobody killed (the target is none)."""
    terms_before = [(cluster.status(via=index) or {}).get("term") for index in range(3)]
    with BackgroundLoad(cluster.nodes, "stability", 0, seconds * 2, work_dir / "background" / "stability") as load:
        cpu_before = [node.cpu_seconds() for node in cluster.nodes]
        started_s, received_from = time.monotonic(), load.received()
        time.sleep(seconds)
        received = load.received() - received_from
        elapsed_s = time.monotonic() - started_s
        cpu_used = [node.cpu_seconds() - before for node, before in zip(cluster.nodes, cpu_before)]
    terms_after = [(cluster.status(via=index) or {}).get("term") for index in range(3)]
    return {"seconds": round(elapsed_s), "received": received, "throughput_per_s": round(received / elapsed_s),
            "node_cpu_pct": [round(used / elapsed_s * 100) for used in cpu_used],
            "terms_before": terms_before, "terms_after": terms_after}
