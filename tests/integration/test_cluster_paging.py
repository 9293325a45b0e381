"""Cold tails in a cluster, black-box: three real `grouper node` processes and proton clients.

Node 1 owns two groups of a durable queue (its consumer was the only one when they were placed, and
keeps owning them, idle, while node 0 sends group `a` past node 1's record budget, then group `b`,
whose messages therefore all go cold on node 1: node 1 knows they are there but not their group).
Then node 1's consumer leaves; a consumer on node 2 waits. Routes expire after group_timeout_ms unless a node relies on
them, and `b`'s only reliance is node 1's cold tail; were it to expire, the next send of `b` would
be placed on node 2, the only node with a consumer, and split the group. So after several group
timeouts a send of `b` must still reach node 1, behind the cold ones. Node 1 killed and restarted
recovers its backlog cold, and a consumer on node 1 then takes every message, each group in order,
while node 2's consumer never sees one. Every wait is bounded and polls.
"""

from __future__ import annotations

import time

import pytest

from node.admin.client import AdminClient
from tests.integration.clients import queue_toml
from tests.integration.cluster import WAIT_S, Cluster
from tests.integration.harness import grouped, wait_until
from tests.integration.test_clustered_groups import bodies

QUEUE = "ledger"
RECORDS_BYTES = 16 << 10  # node 1 keeps ~90 records warm (node/core/dispatch/cold.py counts 160 B a message)
GROUP_TIMEOUT_MS = 1500  # routes nobody relies on expire this soon
A_SENDS = 300  # group a's messages: past the budget, so all of b's go cold
B_SENDS = 150
LEASE_WAITS = 3  # group timeouts waited with b cold


@pytest.fixture
def cluster(tmp_path):
    made = Cluster(tmp_path, 3, f"[node]\nrecord_memory_max_bytes = {RECORDS_BYTES}\n"
                                f"group_timeout_ms = {GROUP_TIMEOUT_MS}\n\n" + queue_toml(QUEUE, durable=True))
    yield made.start()
    made.kill_all()


def stats(node) -> dict:
    with AdminClient(node.admin_address) as admin:
        return next(queue for queue in admin.list_queues() if queue["name"] == QUEUE)


def test_a_cold_tail_on_a_groups_owner_keeps_its_routes_and_drains_in_order_after_a_kill(cluster, clients):
    source, owner, other = cluster.nodes
    placing = clients.consumer(owner, QUEUE, "placing")
    cluster.wait_consumers(QUEUE, {1: 1})
    clients.send(source, QUEUE, [grouped("a:warm", "a"), grouped("b:warm", "b")], name="warm")
    assert sorted(bodies(placing.fetch_many(2))) == ["a:warm", "b:warm"]
    # `placing` keeps owning both groups (exclusive, idle), which keeps their routes alive until the
    # backlog is there: no moment of this set-up leaves a route that nothing relies on
    watching = clients.consumer(other, QUEUE, "watching")
    cluster.wait_consumers(QUEUE, {1: 1, 2: 1})
    sent = [f"a:{number}" for number in range(A_SENDS)] + [f"b:{number}" for number in range(B_SENDS)]
    clients.send(source, QUEUE, [grouped(body, body[0]) for body in sent], name="filler")
    filled = wait_until(lambda: (s := stats(owner))["depth_messages"] == len(sent) and s,
                        "node 1 holds the backlog", timeout_s=WAIT_S)
    assert filled["cold_messages"] >= B_SENDS, filled  # every b, and the newest of a
    placing.connection.close()  # from now on only the cold tail relies on b's route
    cluster.wait_consumers(QUEUE, {1: 0, 2: 1})

    # several group timeouts with b only cold on node 1: its route must live on
    deadline = time.monotonic() + LEASE_WAITS * GROUP_TIMEOUT_MS / 1000
    while time.monotonic() < deadline:
        assert stats(other)["depth_messages"] == 0
        time.sleep(GROUP_TIMEOUT_MS / 1000 / 4)
    clients.send(source, QUEUE, [grouped("b:late", "b")], name="late")
    sent.append("b:late")
    wait_until(lambda: stats(owner)["depth_messages"] == len(sent), "b:late reached node 1", timeout_s=WAIT_S)
    assert stats(other)["depth_messages"] == 0

    owner.kill()
    owner.start()
    restarted = wait_until(lambda: (s := stats(owner))["depth_messages"] == len(sent) and s,
                           "node 1 recovered its backlog", timeout_s=WAIT_S)
    assert restarted["cold_messages"] > 0, f"recovery read every record despite the budget: {restarted}"

    draining = clients.consumer(owner, QUEUE, "draining", credit=50)
    delivered = bodies(draining.fetch_many(len(sent)))
    for group in ("a", "b"):
        assert [body for body in delivered if body[0] == group] == [body for body in sent if body[0] == group]
    assert draining.poll() is None and watching.poll() is None
    drained = wait_until(lambda: (s := stats(owner))["depth_messages"] == 0 and s, "node 1 drained", timeout_s=WAIT_S)
    assert drained["cold_messages"] == 0
