"""Only members forward, on real node processes on 127.0.0.1 (issue 26, finding 2).

A loopback cluster with a raft secret and no cluster TLS takes forwarded batches on its admin port,
each carrying the cluster credential (an HMAC keyed from the raft secret). Its members forward to
each other; a stranger's batch, unsigned or signed with another secret, is refused, logged once per
source and reason, and puts nothing in any queue; a stranger claiming a member's source with a huge
forward seq is refused, and that member's real sends all arrive afterwards. A cluster with no secret
at all (the explicit insecure case) takes the forged jump, but the member, answered a high water
above its own seq bound, disputes it: the owner logs that, sets its mark back, and the member's
sends still all arrive.
Every wait is bounded.
"""

from __future__ import annotations

import grpc
import pytest
from proton import Delivery

from node.peer.signature import Signer
from tests.integration.cluster import Cluster
from tests.integration.harness import ManualReceiver, connect, grouped, send_outcome
from tests.integration.test_cluster_security import banner_value, wait_lines
from tests.integration.test_slow_peers import metrics
from proto import peer_pb2, peer_pb2_grpc

QUEUE = "orders"
SECRET = "integration-forward-secret-0123456789"
OTHER_SECRET = "a-strangers-secret-0123456789"
WAIT_S = 20.0
HUGE_SEQ = 10 ** 18


def start_cluster(directory, secret: str | None) -> Cluster:
    args = ("--allow-insecure-cluster",)  # the explicit insecure case: no raft secret at all
    if secret is not None:
        secret_file = directory / "raft.secret"
        secret_file.write_text(secret + "\n")
        secret_file.chmod(0o600)
        args = ("--raft-secret-file", str(secret_file))
    return Cluster(directory, 3, args=args).start()


def forged_batch(source_node: str, queue: str, seq: int) -> peer_pb2.ForwardBatch:
    batch = peer_pb2.ForwardBatch(source_node=source_node, format_version=1, seq_bound=seq + 1)
    batch.messages.add(forward_seq=seq, queue=queue, has_group=True, group_id="forged", payload=body_of("forged:0"))
    return batch


def body_of(text: str) -> bytes:
    """An encoded AMQP message, as a forwarded payload is."""
    from proton import Message
    return bytes(Message(body=text).encode())


def call(address: str, batch: peer_pb2.ForwardBatch, metadata=None):
    with grpc.insecure_channel(address) as channel:
        return peer_pb2_grpc.PeerServiceStub(channel).Forward(batch, timeout=WAIT_S, metadata=metadata)


def refused(address: str, batch: peer_pb2.ForwardBatch, metadata=None) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as raised:
        call(address, batch, metadata)
    return raised.value


def consume_on_node1_and_send_from_node0(cluster: Cluster, connections: list, count: int,
                                         forged: int = 0) -> dict[str, list[str]]:
    """A consumer on node 1 (so its groups are owned there) and `count` sends per group from node 0,
    forwarded to node 1: what the consumer received, per group, in order (`forged` more messages
    are in the queue)."""
    connections.append(connect(cluster.nodes[1]))
    consumer = ManualReceiver(connections[-1], QUEUE, "c1", credit=200)
    cluster.wait_consumers(QUEUE, {1: 1})
    connections.append(connect(cluster.nodes[0]))
    sender = connections[-1].create_sender(QUEUE, name="p0")
    groups = [f"g{n}" for n in range(4)]
    for seq in range(count):
        for group in groups:
            state, condition = send_outcome(sender, grouped(f"{group}:{seq}", group))
            assert state == Delivery.ACCEPTED, condition
    received = consumer.fetch_many(count * len(groups) + forged)
    by_group: dict[str, list[str]] = {}
    for held in received:
        held.accept()
        group, seq = held.body.split(":")
        by_group.setdefault(group, []).append(seq)
    assert all(group in by_group for group in groups), by_group
    return by_group


def test_a_stranger_cannot_forward_to_the_admin_port_and_a_forged_jump_costs_the_member_nothing(
        tmp_path, connections):
    cluster = start_cluster(tmp_path, SECRET)
    try:
        owner = cluster.nodes[1]
        assert banner_value(owner, "cluster security") == \
            "forwarding signed with a key from the raft secret (on the admin port); raft encrypted (1 secret accepted)"
        # (2) claiming node 0 with a huge forward seq, unsigned or signed with another secret: refused, logged
        forged = forged_batch(cluster.node_ids[0], QUEUE, HUGE_SEQ)
        error = refused(owner.admin_address, forged)
        assert error.code() is grpc.StatusCode.UNAUTHENTICATED and "no forwarding credential" in error.details()
        error = refused(owner.admin_address, forged, Signer([OTHER_SECRET]).metadata(forged, cluster.node_ids[1]))
        assert error.code() is grpc.StatusCode.UNAUTHENTICATED and "does not verify" in error.details()
        logged = wait_lines(owner, "forwarding from 127.0.0.1 refused", count=2)
        assert "no forwarding credential" in logged[0] and "does not verify" in logged[1]
        # (1) a stranger's batch for a queue of its own, likewise: refused, not logged again, nothing queued
        for _ in range(2):
            error = refused(owner.admin_address, forged_batch("stranger:1", "stolen", 1))
            assert error.code() is grpc.StatusCode.UNAUTHENTICATED
        # node 0's real sends to groups node 1 owns all arrive, in order
        by_group = consume_on_node1_and_send_from_node0(cluster, connections, 5)
        assert by_group == {f"g{n}": [str(seq) for seq in range(5)] for n in range(4)}
        listed = owner.cli("queue", "list", "--json")
        assert listed.returncode == 0, listed.stderr
        assert "stolen" not in listed.stdout
        assert len(wait_lines(owner, "forwarding from 127.0.0.1 refused", count=2)) == 2  # once per reason
        assert metrics(owner)['grouper_forward_refused_calls_total{reason="caller"}'] == 4
    finally:
        cluster.kill_all()


def test_without_a_raft_secret_a_forged_jump_is_undone_by_the_members_next_batch_and_logged(tmp_path, connections):
    cluster = start_cluster(tmp_path, None)  # nothing authenticates forwarding: the stranger's batch is taken
    try:
        owner = cluster.nodes[1]
        assert banner_value(owner, "cluster security").startswith("open (--allow-insecure-cluster):")
        assert wait_lines(owner, "has no raft secret: it takes forwarded messages on its admin port from anyone")
        # node 0 forwards first, so node 1 has a mark for it; then the stranger leaps it ahead
        first = consume_on_node1_and_send_from_node0(cluster, connections, 1)
        assert first == {f"g{n}": ["0"] for n in range(4)}
        for connection in connections:
            connection.close()
        connections.clear()
        assert call(owner.admin_address, forged_batch(cluster.node_ids[0], QUEUE, HUGE_SEQ)).high_water == HUGE_SEQ
        by_group = consume_on_node1_and_send_from_node0(cluster, connections, 5, forged=1)
        assert by_group == {"forged": ["0"], **{f"g{n}": [str(seq) for seq in range(5)] for n in range(4)}}
        [logged] = wait_lines(owner, "says it never gave a forward seq")
        assert f"mark for it is {HUGE_SEQ}" in logged and cluster.node_ids[0] in logged
        assert metrics(owner)["grouper_forward_marks_set_back_total"] == 1
    finally:
        cluster.kill_all()
