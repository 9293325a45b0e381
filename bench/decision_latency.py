"""The cluster benchmark's latency phase: new-group route decisions from every node, and forwarded
against local messages from one, all under a background load of half the cluster's throughput
through every node. Probe clients (probes.py) time each message; the nodes' own histograms
(node_readings.py) time each raft decision."""

from __future__ import annotations

import time
from pathlib import Path

from bench.cluster_nodes import Cluster, NodeProcess
from bench.node_readings import cpu_wait_ns, decision_readings, decisions_since, percentiles_ms
from bench.probes import ACCEPTED, Probes
from bench.workloads import BACKGROUND_GROUPS, BackgroundLoad, wait_ready, wait_until


PROBE_NEW_GROUPS = 200  # route decisions timed per producer node
PROBE_EXISTING_MESSAGES = 300  # messages to groups that already have a route, for forwarded vs local
PROBE_INTERVAL_S = 0.02  # one probe message every 20 ms: an idle cluster, not a loaded one
# half load for the decision-latency phase: half of row (b1)'s throughput in the same run, or this
# when (b1) did not run (half of b1's 17,908 msgs/s on 2026-11-23)
HALF_LOAD_DEFAULT_PER_S = 9_000
BACKGROUND_S = 60.0  # the background producers' plan lasts this long at their rate; stopped when the phase ends


def run_latency(cluster: Cluster, work_dir: Path, half_load_per_s: int) -> dict:
    """New-group decisions from every node, and forwarded against local messages from one, all under
    a background load of `half_load_per_s` through every node."""
    nodes = cluster.nodes
    leader = cluster.leader()
    followers = [i for i in range(3) if i != leader]
    with_consumers, without = followers[0], followers[1]
    consuming = sorted([leader, with_consumers])
    order = [with_consumers, without, leader]
    plans = {index: [f"n{index + 1}-{n}" for n in range(PROBE_NEW_GROUPS)] for index in order}
    probes = Probes(work_dir / "probes" / "latency")
    series, decisions, cpu_waits = {}, {}, {}
    try:
        with BackgroundLoad(nodes, "background", half_load_per_s, BACKGROUND_S,
                            work_dir / "background" / "latency") as load:
            # the background's own groups are decided first, so the probes' decisions are the only new ones
            if not wait_until(lambda: load.received() >= 30 * BACKGROUND_GROUPS, BACKGROUND_S / 2, 0.1):
                raise RuntimeError(f"the background load did not reach {30 * BACKGROUND_GROUPS} messages "
                                   f"within {BACKGROUND_S / 2:.0f} s (received {load.received()})")
            wait_ready([probes.consumer(f"consumer-node{i + 1}", nodes[i], "latency") for i in consuming], "latency")
            cluster.wait_consumers("latency", {i: 1 for i in consuming})
            load_from, load_from_s = load.received(), time.monotonic()
            for index in order:
                series[index], decisions[index], cpu_waits[index] = new_group_probe(probes, nodes, index, plans[index])
            # every group above now has a route: send to them again from the follower with consumers
            known = [group for index in order for group in plans[index]]
            existing = known[::max(1, len(known) // PROBE_EXISTING_MESSAGES)][:PROBE_EXISTING_MESSAGES]
            before = decision_readings(nodes)
            go, stop, _, process = probes.producer("existing", nodes[with_consumers], "latency", existing,
                                                   PROBE_INTERVAL_S)
            go.set()
            existing_result = probes.finish_producer("existing", stop, process, len(existing) * PROBE_INTERVAL_S * 3)
            existing_decisions = decisions_since(nodes, before)["count"]
            time.sleep(1.0)  # the last forwarded probes reach their consumers
            background_per_s = round((load.received() - load_from) / (time.monotonic() - load_from_s))
    finally:
        received = probes.finish()
    receipts = first_receipts(received, consuming)
    rows = [new_group_row(series[index], receipts, index) | {
        "is_leader": index == leader, "decision": decisions[index], "cpu_wait_ms_per_s": cpu_waits[index],
        "has_consumers": index in consuming} for index in order]
    return {"leader_node": leader + 1, "consumer_nodes": [i + 1 for i in consuming], "new_groups": rows,
            "existing": existing_row(existing_result, receipts, with_consumers),
            "existing_raft_decisions": existing_decisions,
            "half_load_per_s": half_load_per_s, "background_per_s": background_per_s}


def new_group_probe(probes: Probes, nodes: list[NodeProcess], index: int, plan: list[str]) -> tuple:
    """Node `index` sends the first message of each group in `plan`: (the producer's record, the raft
    decisions the nodes timed meanwhile, each node's CPU wait in ms per second meanwhile)."""
    name = f"new-groups-from-node{index + 1}"
    before = decision_readings(nodes)
    waited_before, waited_from_s = [cpu_wait_ns(node) for node in nodes], time.monotonic()
    go, stop, _, process = probes.producer(name, nodes[index], "latency", plan, PROBE_INTERVAL_S)
    go.set()
    record = probes.finish_producer(name, stop, process, PROBE_NEW_GROUPS * PROBE_INTERVAL_S * 3)
    decisions = decisions_since(nodes, before)
    elapsed_s = time.monotonic() - waited_from_s
    cpu_waits = [round((cpu_wait_ns(node) - earlier) / 1e6 / elapsed_s) for node, earlier in zip(nodes, waited_before)]
    return record, decisions, cpu_waits


def first_receipts(received: dict, consuming: list[int]) -> dict[int, tuple[int, int]]:
    """sent ns -> (first receipt ns, consuming node index): every message carries its send time, unique
    per message, so it is the key of its first receipt."""
    receipts: dict[int, tuple[int, int]] = {}
    for index in consuming:
        record = received.get(f"consumer-node{index + 1}") or {"sent_ns": [], "received_ns": []}
        for sent_ns, at in zip(record["sent_ns"], record["received_ns"]):
            receipts.setdefault(sent_ns, (at, index))
    return receipts


def new_group_row(sent: dict, receipts: dict, index: int) -> dict:
    """Accept and receive times of node `index`'s new-group probes, and how many stayed on its node."""
    accept, deliver, placed_local, failed = [], [], 0, 0
    for sent_ns, settled_ns, state in zip(sent["sent_ns"], sent["settled_ns"], sent["states"]):
        if state != ACCEPTED:
            failed += 1
            continue
        accept.append(settled_ns - sent_ns)
        receipt = receipts.get(sent_ns)
        if receipt is not None:
            deliver.append(receipt[0] - sent_ns)
            placed_local += receipt[1] == index
    return {"producer_node": index + 1, "sent": len(sent["sent_ns"]), "not_accepted": failed,
            "received": len(deliver), "placed_on_producer_node": placed_local,
            "accept": percentiles_ms(accept), "receive": percentiles_ms(deliver), "error": sent.get("error", "")}


def existing_row(sent: dict, receipts: dict, producer: int) -> dict:
    """Messages to groups that have a route: local when the producer node's consumer received them, else
    forwarded."""
    times = {"local": ([], []), "forwarded": ([], [])}
    missing = 0
    for sent_ns, settled_ns, state in zip(sent["sent_ns"], sent["settled_ns"], sent["states"]):
        receipt = receipts.get(sent_ns)
        if receipt is None or state != ACCEPTED:
            missing += 1
            continue
        accept, receive = times["local" if receipt[1] == producer else "forwarded"]
        accept.append(settled_ns - sent_ns)
        receive.append(receipt[0] - sent_ns)
    row = {"producer_node": producer + 1, "missing": missing}
    for kind, (accept, receive) in times.items():
        row[f"{kind}_accept"] = percentiles_ms(accept)
        row[f"{kind}_receive"] = percentiles_ms(receive)
    return row
