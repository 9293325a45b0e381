"""Groups follow their consumers (route_follow_ms), against three real node processes.

A group is placed on the node its first consumers were on. When they leave that node for another,
the group, with what it has queued there, moves after route_follow_ms to the node they went to, while
producers on other nodes keep sending, and its consumer there gets every message in order.
"""

from __future__ import annotations

import time

import pytest
from proton import Delivery

from tests.integration.cluster import WAIT_S, Cluster, in_transit
from tests.integration.harness import grouped, send_outcome
from tests.integration.test_clustered_groups import QUEUE, Clients, by_group

ROUTE_FOLLOW_MS = 1000
FOLLOW_CONFIG = f"[node]\nroute_follow_ms = {ROUTE_FOLLOW_MS}\n"


@pytest.fixture
def cluster(tmp_path):
    made = Cluster(tmp_path, 3, FOLLOW_CONFIG)
    yield made.start()
    made.kill_all()


@pytest.fixture
def clients():
    made = Clients()
    yield made
    made.close()


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
    received = []
    for held in arriving.fetch_many(2 * seq):
        received.append(held.body)
        held.accept()
    assert by_group(received) == {"g": list(range(seq)), "h": list(range(seq))}
    assert arriving.poll() is None
    assert in_transit([cluster.status(via=index) for index in range(3)]) == []
