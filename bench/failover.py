"""The cluster benchmark's failover phases: kill -9 the raft leader under light load and time the
next accepted new group; kill -9 the node that owns busy groups, restart it, and time their next
delivery. Each repetition restarts the killed node and waits until it is a connected member again.
Probe clients (probes.py) record every message; the functions here turn their records into numbers."""

from __future__ import annotations

import time
from pathlib import Path

from bench.cluster_nodes import Cluster
from bench.node_readings import leader_since, percentiles_ms
from bench.phase_log import log
from bench.probes import ACCEPTED, Probes
from bench.workloads import wait_ready, wait_until


KILL_REPEATS = 5
LEADER_PROBE_INTERVAL_S = 0.005  # light load during the leader kill: a new group every 5 ms
STEADY_BEFORE_KILL_S = 1.0
RECOVERY_WAIT_S = 20.0  # longest wait for traffic to resume after a kill
OWNER_GROUPS = 20  # busy groups on the owner that is killed
OWNER_PROBE_INTERVAL_S = 0.003  # ~330 msgs/s over those groups
DRAIN_WAIT_S = 15.0  # after the producer stops, for the consumers to receive every accepted message


def run_leader_kills(cluster: Cluster, work_dir: Path, repeats: int) -> dict:
    nodes = cluster.nodes
    probes = Probes(work_dir / "probes" / "leader")
    repetitions = []
    try:
        wait_ready([probes.consumer(f"consumer-node{i + 1}", nodes[i], "leader") for i in range(3)], "leader kill")
        cluster.wait_consumers("leader", {0: 1, 1: 1, 2: 1})
        for repeat in range(repeats):
            leader = cluster.leader()
            producer_node = next(i for i in range(3) if i != leader)
            name = f"producer-{repeat}"
            go, stop, accepted_after, process = probes.producer(name, nodes[producer_node], "leader",
                                                                f"k{repeat}", LEADER_PROBE_INTERVAL_S)
            go.set()
            time.sleep(STEADY_BEFORE_KILL_S)
            kill_wall_s, kill_ns = time.time(), time.monotonic_ns()
            accepted_after[0] = kill_ns
            nodes[leader].kill()
            resumed = wait_until(lambda: accepted_after[1] != 0, RECOVERY_WAIT_S, 0.005)
            time.sleep(0.5)
            sent = probes.finish_producer(name, stop, process)
            new_leader_status = cluster.status(producer_node)
            elected_s = [t for i in range(3) if i != leader for t in leader_since(nodes[i], kill_wall_s)]
            restart_ns = time.monotonic_ns()
            ready_s = nodes[leader].start_timed()
            cluster.wait_healthy(via=leader)
            cluster.wait_healthy(via=producer_node)
            member_again_s = (time.monotonic_ns() - restart_ns) / 1e9
            cluster.wait_consumers("leader", {0: 1, 1: 1, 2: 1})
            repetitions.append(leader_kill_numbers(sent, kill_ns) | {"resumed_while_watching": resumed,
                "killed_node": leader + 1, "producer_node": producer_node + 1,
                "new_leader_node": (cluster.node_ids.index(new_leader_status["leader"]) + 1
                                    if new_leader_status and new_leader_status["leader"] else None),
                "kill_to_new_leader_ms": round((min(elected_s) - kill_wall_s) * 1000) if elected_s else None,
                "restart_to_ready_s": round(ready_s, 2), "restart_to_member_s": round(member_again_s, 2)})
            log(f"[leader kill {repeat + 1}] {repetitions[-1]}")
    finally:
        probes.finish()
    values = [r["kill_to_first_accept_ms"] for r in repetitions if r["kill_to_first_accept_ms"] is not None]
    return {"repetitions": repetitions, "worst_ms": max(values) if values else None,
            "median_ms": sorted(values)[len(values) // 2] if values else None}


def leader_kill_numbers(sent: dict, kill_ns: int) -> dict:
    """From the producer's record: when route decisions came back after the kill, and the stall."""
    rows = [(at, settled) for at, settled, state in zip(sent["sent_ns"], sent["settled_ns"], sent["states"])
            if state == ACCEPTED]
    after_kill = [settled for at, settled in rows if at >= kill_ns]
    before_kill = [settled for at, settled in rows if settled < kill_ns]
    first = min(after_kill) if after_kill else None
    ms = lambda value: round(value / 1e6, 1)  # noqa: E731
    return {"kill_to_first_accept_ms": ms(first - kill_ns) if first else None,
            "gap_between_accepts_ms": ms(min(settled for _, settled in rows if settled >= kill_ns) - max(before_kill))
            if first and before_kill else None,
            "longest_send_to_accept_ms": ms(max(settled - at for at, settled in rows)) if rows else None,
            "before_kill_accept": percentiles_ms([settled - at for at, settled in rows if settled < kill_ns]),
            "slow_sends": [(ms(at - kill_ns), ms(settled - at)) for at, settled in rows if settled - at > 20e6][:40],
            "sent": len(sent["sent_ns"]), "not_accepted": len(sent["sent_ns"]) - len(rows),
            "producer_error": sent.get("error", "")}


def run_owner_kills(cluster: Cluster, work_dir: Path, repeats: int) -> dict:
    nodes = cluster.nodes
    repetitions = []
    for repeat in range(repeats):
        leader = cluster.leader()
        followers = [i for i in range(3) if i != leader]
        owner, producer_node = followers[repeat % 2], followers[(repeat + 1) % 2]
        groups = [f"o{repeat}-{n}" for n in range(OWNER_GROUPS)]
        plan = groups * int(RECOVERY_WAIT_S * 3 / OWNER_PROBE_INTERVAL_S / OWNER_GROUPS)  # outlasts the repetition
        probes = Probes(work_dir / "probes" / f"owner{repeat}")
        try:
            ready, watch = probes.consumer("consumer", nodes[owner], "owner")
            wait_ready([(ready, watch)], "owner kill")
            cluster.wait_consumers("owner", {owner: 1})
            go, stop, accepted_after, process = probes.producer("producer", nodes[producer_node], "owner", plan,
                                                                OWNER_PROBE_INTERVAL_S)
            go.set()
            time.sleep(2.0)
            kill_ns = time.monotonic_ns()
            watch[0] = kill_ns
            nodes[owner].kill()
            restart_ns = time.monotonic_ns()
            ready_s = nodes[owner].start_timed()
            ready_ns = restart_ns + int(ready_s * 1e9)
            resumed = wait_until(lambda: watch[2] != 0, RECOVERY_WAIT_S, 0.01)
            time.sleep(1.0)
            stop.set()
            # every accepted message reaches the consumer (redeliveries make the count an upper bound)
            sent = probes.finish_producer("producer", stop, process)
            accepted = sum(1 for state in sent["states"] if state == ACCEPTED)
            wait_until(lambda: watch[3] >= accepted, DRAIN_WAIT_S, 0.05)
            time.sleep(0.5)
        finally:
            received = probes.finish()
        consumer = received.get("consumer") or {"received_ns": [], "indexes": [], "sent_ns": [], "attached_ns": []}
        repetitions.append(owner_kill_numbers(consumer, sent, kill_ns, restart_ns, ready_ns, accepted) | {
            "owner_node": owner + 1, "producer_node": producer_node + 1, "leader_node": leader + 1,
            "resumed": resumed, "restart_to_ready_s": round(ready_s, 2)})
        log(f"[owner kill {repeat + 1}] {repetitions[-1]}")
        cluster.wait_healthy(via=owner)
    return {"repetitions": repetitions}


def owner_kill_numbers(consumer: dict, sent: dict, kill_ns: int, restart_ns: int, ready_ns: int, accepted: int) -> dict:
    received = list(zip(consumer["received_ns"], consumer["sent_ns"]))
    attached_after = [at for at in consumer["attached_ns"] if at > kill_ns]
    # what arrives on the old connection after the kill was sent before it: count from the re-attach
    reattached_ns = min(attached_after) if attached_after else None
    after = [at for at, _ in received if reattached_ns and at >= reattached_ns]
    outage = [at for at, sent_ns in received if reattached_ns and at >= reattached_ns and sent_ns >= kill_ns]
    accepted_sends = {at for at, state in zip(sent["sent_ns"], sent["states"]) if state == ACCEPTED}
    seen = [sent_ns for _, sent_ns in received]
    unique = set(seen)
    ms = lambda end, start: round((end - start) / 1e6, 1) if end else None  # noqa: E731
    first, first_outage = (min(after) if after else None), (min(outage) if outage else None)
    return {"restart_to_first_delivery_ms": ms(first, restart_ns), "kill_to_first_delivery_ms": ms(first, kill_ns),
            "restart_to_consumer_attached_ms": ms(reattached_ns, restart_ns),
            "ready_to_first_delivery_ms": ms(first, ready_ns),
            "restart_to_first_outage_message_ms": ms(first_outage, restart_ns),
            "ready_to_first_outage_message_ms": ms(first_outage, ready_ns),
            "kill_to_first_outage_message_ms": ms(first_outage, kill_ns),
            "sent": len(sent["sent_ns"]), "accepted": accepted,
            "sent_during_outage": sum(1 for at in sent["sent_ns"] if kill_ns <= at < ready_ns),
            "lost": len(accepted_sends - unique), "redelivered": len(seen) - len(unique),
            "producer_error": sent.get("error", ""), "consumer_errors": consumer.get("errors", [])}
