"""A member's raft address taken by another node: the misdirected connections are refused.

As in Kubernetes when a restarted pod's old IP goes to another pod: the other members still dial the
old address and reach a node that is not the member they meant. Here, on 127.0.0.1, a stranger node
with its own node id (advertised as 127.0.0.2, the "new IP") listens on a stopped member's raft
address. Both other members dial that address (the member with the smallest id is dialled by both);
the stranger must close their connections, saying so in its log, and they must not count the stopped
member as connected. Once the stranger has gone and the member is back at its address, the raft
cluster forms again and decides routes. Every wait is bounded.
"""

from __future__ import annotations

import time

import pytest
from proton import Delivery

from tests.integration.cluster import Cluster
from tests.integration.harness import ManualReceiver, NodeProcess, connect, grouped, send_outcome

QUEUE = "orders"
REFUSAL_WAIT_S = 15.0  # members redial every 0.2 s; a node starts in about a second, more under load
POLL_S = 0.1


@pytest.fixture
def cluster(tmp_path):
    made = Cluster(tmp_path, 3)
    try:
        yield made.start()
    finally:
        made.kill_all()


def connected_view(cluster: Cluster, via: int) -> dict[str, bool]:
    status = cluster.status(via)
    assert status is not None, f"node {via} did not answer"
    return {member["node"]: member["connected"] for member in status["members"]}


def wait_lines(node: NodeProcess, needles: list[str], timeout_s: float) -> list[str]:
    """Until, for every needle, a line of `node`'s output contains it; returns those lines."""
    deadline_s = time.monotonic() + timeout_s
    while True:
        found = {needle: next((line for line in list(node.output) if needle in line), None) for needle in needles}
        if all(found.values()):
            return list(found.values())
        if time.monotonic() > deadline_s:
            missing = [needle for needle, line in found.items() if line is None]
            raise AssertionError(f"no line with {missing} within {timeout_s} s; its output:\n"
                                 + "\n".join(node.output[-40:]))
        time.sleep(POLL_S)


def test_a_node_listening_at_a_stopped_members_address_refuses_connections_meant_for_that_member(cluster, tmp_path):
    member_id = min(cluster.node_ids)  # the other two dial it: the greater address dials
    member = cluster.index_of(member_id)
    dialers = [i for i in range(3) if i != member]
    port = member_id.rsplit(":", 1)[1]
    cluster.nodes[member].stop()
    for i in dialers:
        cluster.wait_for(lambda s: not {m["node"]: m["connected"] for m in s["members"]}[member_id],
                         f"node {i} sees {member_id} gone", via=i)

    stranger_id = f"127.0.0.2:{port}"  # its own id; it listens on 127.0.0.1:port, the member's address
    stranger = NodeProcess(tmp_path / "stranger", "", (
        "--raft-port", port, "--advertise-host", "127.0.0.2",
        "--peers", ",".join([*(cluster.node_ids[i] for i in dialers), stranger_id])))
    try:  # the stranger holds the member's address until it is stopped
        stranger.start()
        lines = wait_lines(stranger, [f"member {cluster.node_ids[i]} dialled {member_id} but reached this node, "
                                      f"{stranger_id}" for i in dialers], REFUSAL_WAIT_S)
        assert all(" WARNING " in line and "raft connection refused" in line for line in lines), lines
        for i in dialers:  # a refused dialer is connected only for the moment of each redial
            cluster.wait_for(lambda s: not {m["node"]: m["connected"] for m in s["members"]}[member_id],
                             f"node {i} not taking the stranger for {member_id}", via=i)
        assert cluster.status(dialers[0])["has_quorum"]
        assert stranger.stop() == 0, stranger.output[-20:]
    finally:
        stranger.kill()

    cluster.nodes[member].start()
    for i in range(3):
        cluster.wait_for(lambda s: all(m["connected"] for m in s["members"]) and s["leader"] in cluster.node_ids,
                         f"node {i} connected to every member again, with a leader", via=i)
    assert connected_view(cluster, member) == {node_id: True for node_id in cluster.node_ids}
    receiving = connect(cluster.nodes[member])
    sending = connect(cluster.nodes[dialers[0]])
    try:
        consumer = ManualReceiver(receiving, QUEUE, "c-member", credit=10)
        cluster.wait_consumers(QUEUE, {member: 1})
        sender = sending.create_sender(QUEUE, name="p")
        for n in range(3):
            assert send_outcome(sender, grouped(f"g:{n}", "g")) == (Delivery.ACCEPTED, None)
        received = [consumer.fetch() for _ in range(3)]
        for held in received:
            held.accept()
        assert [held.body for held in received] == ["g:0", "g:1", "g:2"]
    finally:
        sending.close()
        receiving.close()
