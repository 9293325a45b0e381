"""Groups follow their consumers (route_follow_ms), against three real node processes.

A group is placed on the node its first consumers were on. When they leave that node for another,
the group, with what it has queued there, moves after route_follow_ms to the node they went to, while
producers on other nodes keep sending, and its consumer there gets every message in order. With a
record budget the backlog is mostly cold on the old node, and a kill -9 brings it back cold: the move
sweeps the cold tail for the groups' messages (node/core/cluster/sweep.py).
"""

from __future__ import annotations

import re
import time
import urllib.request

import pytest
from proton import Delivery

from node.admin.client import AdminClient
from tests.integration.clients import queue_toml
from tests.integration.cluster import WAIT_S, in_transit
from tests.integration.harness import grouped, send_outcome, wait_until
from tests.integration.test_clustered_groups import QUEUE, bodies, by_group

ROUTE_FOLLOW_MS = 1000
FOLLOW_CONFIG = f"[node]\nroute_follow_ms = {ROUTE_FOLLOW_MS}\n"
RECORDS_BYTES = 8 << 10  # ~50 records warm (node/core/dispatch/cold.py counts 160 B a message)
COLD_SENDS = 150  # per group, queued on node a: most go cold


@pytest.fixture
def cluster(cluster_factory):
    return cluster_factory(FOLLOW_CONFIG)


@pytest.fixture
def cold_cluster(cluster_factory):
    return cluster_factory(FOLLOW_CONFIG + f"record_memory_max_bytes = {RECORDS_BYTES}\n\n"
                           + queue_toml(QUEUE, durable=True))


def stats(node) -> dict:
    with AdminClient(node.admin_address) as admin:
        return next(queue for queue in admin.list_queues() if queue["name"] == QUEUE)


def moved(node, how: str) -> float:
    """grouper_moved_messages_total{how=...} on the node's /metrics."""
    with urllib.request.urlopen(f"http://{node.http_address}/metrics", timeout=WAIT_S) as response:
        text = response.read().decode()
    found = re.search(rf'^grouper_moved_messages_total{{how="{how}"}} (\S+)$', text, re.MULTILINE)
    assert found, f"no {how} in /metrics"
    return float(found.group(1))


def send(sender, group: str, seqs) -> None:
    for seq in seqs:
        state, condition = send_outcome(sender, grouped(f"{group}:{seq}", group))
        assert state == Delivery.ACCEPTED, (group, seq, condition)


def test_consumers_leaving_a_node_take_its_groups_and_their_queued_messages_with_them_in_order(
        cluster, clients):
    a, b, c = cluster.nodes
    leaving = clients.consumer(a, QUEUE, "leaving", credit=0)  # no credit: the groups' messages queue on a
    cluster.wait_consumers(QUEUE, {0: 1, 1: 0, 2: 0})
    on_b = clients.connection(b).create_sender(QUEUE, name="producer-b")
    on_c = clients.connection(c).create_sender(QUEUE, name="producer-c")
    send(on_b, "g", range(10))
    send(on_c, "h", range(10))
    assert {row["group"]: row["node"] for row in cluster.groups(QUEUE)} == {"g": cluster.node_ids[0],
                                                                             "h": cluster.node_ids[0]}
    leaving.close()
    arriving = clients.consumer(b, QUEUE, "arriving", credit=0)
    cluster.wait_consumers(QUEUE, {0: 0, 1: 1})
    deadline = time.monotonic() + WAIT_S
    seq = 10
    while time.monotonic() < deadline:  # the producers keep sending while the groups move
        send(on_b, "g", [seq])
        send(on_c, "h", [seq])
        seq += 1
        rows = cluster.groups(QUEUE)
        if rows and all(row["node"] == cluster.node_ids[1] for row in rows) and seq > 20:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the groups did not follow their consumers to node b: {cluster.groups(QUEUE)}")
    assert by_group(bodies(arriving.fetch_many(2 * seq))) == {"g": list(range(seq)), "h": list(range(seq))}
    assert arriving.poll() is None
    assert in_transit([cluster.status(via=index) for index in range(3)]) == []


def test_groups_moving_away_take_their_cold_messages_along_in_order_after_a_kill(cold_cluster, clients):
    cluster = cold_cluster
    a, b, c = cluster.nodes
    leaving = clients.consumer(a, QUEUE, "leaving", credit=0)
    cluster.wait_consumers(QUEUE, {0: 1, 1: 0, 2: 0})
    on_b = clients.connection(b).create_sender(QUEUE, name="producer-b")
    on_c = clients.connection(c).create_sender(QUEUE, name="producer-c")
    send(on_b, "g", range(COLD_SENDS))
    send(on_c, "h", range(COLD_SENDS))
    filled = wait_until(lambda: (s := stats(a))["depth_messages"] == 2 * COLD_SENDS and s, "node a holds the backlog")
    assert filled["cold_messages"] > COLD_SENDS, filled
    a.kill()  # the consumer goes with it; a recovers its backlog cold
    a.start()
    restarted = wait_until(lambda: (s := stats(a))["depth_messages"] == 2 * COLD_SENDS and s, "node a recovered")
    assert restarted["cold_messages"] > COLD_SENDS, restarted
    del leaving
    arriving = clients.consumer(b, QUEUE, "arriving", credit=0)
    cluster.wait_consumers(QUEUE, {0: 0, 1: 1})
    seq = COLD_SENDS
    deadline = time.monotonic() + 2 * WAIT_S
    while time.monotonic() < deadline:  # the producers keep sending while the groups move
        send(on_b, "g", [seq])
        send(on_c, "h", [seq])
        seq += 1
        rows = cluster.groups(QUEUE, via=1)
        if rows and all(row["node"] == cluster.node_ids[1] for row in rows) and stats(a)["depth_messages"] == 0:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the groups did not move to b with their cold messages: {cluster.groups(QUEUE, via=1)}, "
                             f"node a {stats(a)}")
    assert by_group(bodies(arriving.fetch_many(2 * seq))) == {"g": list(range(seq)), "h": list(range(seq))}
    assert arriving.poll() is None
    assert stats(a)["cold_messages"] == 0
    assert moved(a, "cold_handed_over") > 0  # what was cold on a went by the sweep, not by a read-back
