"""What the HTTP endpoints read of a running node: readiness (/readyz) and the metrics snapshot (/metrics).

Rules:
- Called on the HTTP threads (node/http_port/server.py): the broker, the server and the cluster link are read on the
  engine loop through `Bridge.call`, with PROBE_TIMEOUT_MS as its deadline; only the raft member's
  handle is asked from the HTTP thread.
- One loop visit and one raft status per scrape: the metrics snapshot carries readiness too.
- `node` is a node.runtime.Node, taken as it comes (runtime imports this module, not back).
"""

from __future__ import annotations

import os

from node.http_port.server import PROBE_TIMEOUT_MS


def resident_bytes() -> int | None:
    """This process's resident set size now (not its peak, which getrusage gives); None off Linux."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None



def readiness(node) -> tuple[bool, str]:
    if not node.serving or node.server.stopping:
        return False, "starting" if not node.serving else "stopping"
    if node.cluster is None:
        return True, ""
    try:
        caught_up, registered = node.bridge.call(lambda: (node.cluster.router.ready, node.cluster.registered),
                                                 PROBE_TIMEOUT_MS)
    except TimeoutError:
        return False, f"the engine loop did not answer within {PROBE_TIMEOUT_MS} ms"
    return cluster_readiness(node.handler.status(), caught_up, registered)

def metrics_snapshot(node) -> dict:
    def read():
        consumers = []
        for state in node.server.consumers.values():
            if state.browse:
                continue
            queue = node.broker.queues.get(state.queue)
            core = queue.consumers.get(state.id) if queue is not None else None
            if core is not None:
                consumers.append((state.queue, state.label, core.assigned_count))
        cluster = None
        if node.cluster is not None:
            router = node.cluster.router
            cluster = {**node.cluster.status(), "decisions": dict(router.decisions),
                       "forward_refusals": dict(node.forward_refusals),
                       "decision_latency": router.decision_latency.snapshot(),
                       "raft_decision_latency": node.cluster.raft_decision_latency.snapshot(),
                       "caught_up": router.ready, "registered": node.cluster.registered}
        return (node.broker.list_queues(), consumers, cluster, node.serving and not node.server.stopping,
                node.server.engine_objects(), dict(node.server.unrouted))

    queues, consumers, cluster, serving, engine, unrouted = node.bridge.call(read, PROBE_TIMEOUT_MS)
    ready = serving
    if cluster is not None:  # one raft status and one loop visit per scrape serve readiness too
        cluster["raft"] = node.handler.status()
        ready = serving and cluster_readiness(cluster["raft"], cluster["caught_up"], cluster["registered"])[0]
    return {"ready": ready, "queues": queues, "consumers": consumers, "cluster": cluster,
            "unrouted": unrouted,
            "journal": node.journal.stats() if node.journal is not None else None, "engine": engine,
            "trace": node.trace_writer.stats(),
            "resident_bytes": resident_bytes()}


def cluster_readiness(raft: dict, caught_up: bool, registered: bool) -> tuple[bool, str]:
    if not raft["leader"] or not raft["has_quorum"]:
        return False, (f"no raft leader known (term {raft['term']})" if not raft["leader"] else
                       f"no raft majority connected (members {', '.join(raft['members'])})") + \
            "; is a majority of --peers up and reachable?"
    if not caught_up:
        return False, "replaying the grouping handler's log"
    if not registered:
        return False, "not yet registered with the cluster"
    return True, ""
