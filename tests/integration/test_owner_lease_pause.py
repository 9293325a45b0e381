"""The owner's lease on three real node processes (issue 28, node/core/cluster/owner_lease.py): an owner whose raft
member is paused (SIGSTOP: it hears from no leader and answers its node nothing) stops delivering its replicated
groups within replica_lease_ms and refuses their sends, naming the lease; once the member runs again it serves
them again, in order. The pause stays well short of promotion (the leader's connection timeout, 3.5 s, plus
replica_failover_ms), so the groups are still the owner's when contact returns. Every wait is bounded.
"""

from __future__ import annotations

import os
import signal
import time

from proton import Delivery, Timeout

from tests.integration.clients import queue_toml
from tests.integration.harness import ManualReceiver, connect, grouped, member_children, send_outcome

QUEUE = "orders"
REPLICA_FAILOVER_MS = 2000
REPLICA_LEASE_MS = 700  # at most 2000 - 2 x 500 (the raft leader's fallback) - 250 (margin)
NODE_TICK_S = 0.1  # node/amqp/loop.py: when a lapse is noticed
CONFIG = (f"[node]\nreplication_factor = 2\nplacement = \"local\"\nreplica_failover_ms = {REPLICA_FAILOVER_MS}\n"
          f"replica_lease_ms = {REPLICA_LEASE_MS}\n" + queue_toml(QUEUE, durable=True))


def send_refusal(sender, message) -> tuple:
    delivery = sender.link.send(message)
    sender.connection.wait(lambda: delivery.settled, timeout=10, msg="the send's outcome")
    condition = delivery.remote.condition
    delivery.settle()
    return delivery.remote_state, condition.name if condition else None, condition.description if condition else ""


def test_an_owner_cut_off_from_the_raft_leader_stops_within_its_lease_and_serves_again_on_contact(
        cluster_factory, connections):
    cluster = cluster_factory(CONFIG)
    owner_node = cluster.nodes[0]
    connection = connect(owner_node)
    connections.append(connection)
    receiver = ManualReceiver(connection, QUEUE, "local", credit=0)
    cluster.wait_consumers(QUEUE, {0: 1})
    sender = connection.create_sender(QUEUE, name="producer")
    for seq in (1, 2, 3):  # the group lives here (local placement): the owner queues them
        assert send_outcome(sender, grouped(f"g:{seq}", "g"))[0] == Delivery.ACCEPTED
    assert receiver.fetch().message.body == "g:1"

    [member] = member_children(owner_node.process.pid)
    os.kill(member, signal.SIGSTOP)
    try:
        stopped_s = time.monotonic()
        time.sleep(REPLICA_LEASE_MS / 1000 + 2 * NODE_TICK_S + 0.1)  # the lease, the tick that notices, slack
        receiver.flow(2)
        try:
            connection.wait(lambda: receiver.arrived_count > 0, timeout=0.5, msg="a delivery while lapsed")
        except Timeout:
            pass
        assert receiver.arrived_count == 0, "a replicated group was delivered after the owner's lease lapsed"
        state, condition, description = send_refusal(sender, grouped("g:4", "g"))
        assert (state, condition) == (Delivery.REJECTED, "grouper:grouping-handler-unavailable"), description
        assert f"replica_lease_ms={REPLICA_LEASE_MS}" in description, description
        assert time.monotonic() - stopped_s < 3.0  # far from promotion: the groups are still this node's
    finally:
        os.kill(member, signal.SIGCONT)
    resumed_s = time.monotonic()
    bodies = [held.message.body for held in receiver.fetch_many(2, timeout_s=10)]
    print(f"served again {time.monotonic() - resumed_s:.2f} s after the member resumed")
    assert bodies == ["g:2", "g:3"]
    assert send_outcome(sender, grouped("g:5", "g"))[0] == Delivery.ACCEPTED
    assert any("owner lease LAPSED" in line for line in owner_node.output)
