"""Issue 29, as a python-qpid-proton user sees it: on a durable queue only durable messages survive a crash.

A message whose AMQP header says durable false (proton's default: Message() sends no header) is kept in
memory only; a durable one (Message(durable=True)) is journalled before it is accepted. While the node
runs, one group's messages of both kinds arrive in the order they were sent; after kill -9 (or a clean
stop) and a restart, the durable ones come back, in order, and the others are gone. In a cluster the same
holds for messages forwarded to their group's owner (proto/peer.proto Forwarded.not_durable).
"""

from __future__ import annotations

import pytest
from proton import Message

from tests.integration.clients import Client, parse_body, queue_toml
from tests.integration.test_clustered_groups import bodies

QUEUE = "orders"


def message(seq: int, durable: bool) -> Message:
    sent = Message(body=f"g:{seq}", durable=durable)
    sent.group_id = "g"
    return sent


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_a_restart_keeps_a_groups_durable_messages_in_order_and_loses_its_non_durable_ones(node_factory, how):
    node = node_factory(queue_toml(QUEUE, durable=True))
    kinds = {1: True, 2: False, 3: True, 4: False}
    with Client(node) as client:
        client.producer(QUEUE).send(*[message(seq, durable) for seq, durable in kinds.items()])  # all accepted
        before = client.consumer(QUEUE, "before", credit=10).take(4)  # none accepted: released at the close
        assert [parse_body(r.message) for r in before] == [("g", 1), ("g", 2), ("g", 3), ("g", 4)]
        assert [r.message.durable for r in before] == [True, False, True, False]
    if how == "kill":
        node.kill()  # kill -9
    else:
        assert node.stop() == 0
    node.start()

    with Client(node) as client:
        after = client.consumer(QUEUE, "after", credit=10).take_all()
        assert [parse_body(r.message) for r in after] == [("g", 1), ("g", 3)]


def test_a_forwarded_groups_durable_messages_outlive_a_crash_of_its_owner_and_its_non_durable_ones_do_not(
        cluster_factory, clients):
    cluster = cluster_factory(queue_toml(QUEUE, durable=True))
    source, owner, _ = cluster.nodes
    placing = clients.consumer(owner, QUEUE, "placing")  # the group's first message places it on node 1
    cluster.wait_consumers(QUEUE, {1: 1})
    clients.send(source, QUEUE, [message(seq, durable) for seq, durable in ((1, True), (2, False), (3, True))])
    assert [held.body for held in placing.fetch_many(3)] == ["g:1", "g:2", "g:3"]  # forwarded, in order; held
    owner.kill()  # kill -9
    owner.start()
    after = clients.consumer(owner, QUEUE, "after")
    assert bodies(after.fetch_many(2)) == ["g:1", "g:3"]
    assert after.poll() is None
