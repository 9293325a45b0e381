"""The owner's replica streams on a real 3-node cluster (issue 28, phase 3): a durable queue with
replication_factor 2, grouped sends with python-qpid-proton to the owner. The owner proposes both backups
in sync once each copied what it backs (cluster status: no under-replication); each backup's replica
journal then holds exactly the live messages of the groups it backs (what was settled is removed there
too); a backup killed with -9 stops being waited on once replica_lag_ms passed and raft took it out of
the set: accepts resume, and the owner shows under-replicated."""

from __future__ import annotations

import time

from proton import Message

from node.core.replication.assignment import backups_of
from node.store.replica_journal import ReplicaJournal
from tests.integration.harness import grouped
from tests.integration.test_clustered_groups import bodies

LAG_MS = 600
CONFIG = f"""
[node]
replica_lag_ms = {LAG_MS}

[[queue]]
name = "orders"
replication_factor = 2
"""
GROUPS = [f"g{number}" for number in range(8)]


def owner_row(status, owner: str) -> dict:
    return {member["node"]: member for member in status["members"]}[owner]


def replica_bodies(node, owner: str) -> dict:
    """group -> bodies of the live messages `node`'s replica journal of `owner` holds (the node stopped)."""
    journal = ReplicaJournal(str(node.data_dir), owner).open()
    try:
        live = journal.live([("orders", group) for group in GROUPS])
    finally:
        journal.close()
    decoded = {}
    for (_, group), messages in live.items():
        decoded[group] = []
        for message in messages:
            amqp = Message()
            amqp.decode(message.payload)
            decoded[group].append(amqp.body)
    return decoded


def test_a_durable_queues_messages_reach_their_groups_backups_before_accepted(cluster_factory, clients):
    cluster = cluster_factory(CONFIG)
    owner_node, ids = cluster.nodes[0], cluster.node_ids
    owner, backed = ids[0], {}
    for index in (1, 2):
        backed[index] = [group for group in GROUPS if ids[index] in backups_of(owner, "orders", group, sorted(ids), 2)]
    assert backed[1] and backed[2]
    consumer = clients.consumer(owner_node, "orders", "c0", credit=0)  # the groups are placed on node 0
    cluster.wait_consumers("orders", {0: 1, 1: 0, 2: 0})
    clients.send(owner_node, "orders", [grouped(f"{group}:0", group) for group in GROUPS])  # before any stream
    cluster.wait_for(lambda status: sorted(owner_row(status, owner)["in_sync"]) == sorted(ids[1:]),
                     "both backups in sync", timeout_s=10)
    assert not owner_row(cluster.status(), owner)["under_replicated"]

    consumer.flow(len(GROUPS))
    first = consumer.fetch_many(len(GROUPS))
    for held in first:
        held.accept()
    assert sorted(bodies(first)) == sorted(f"{group}:0" for group in GROUPS)
    time.sleep(0.3)  # the settlements reach the owner (they are streamed, not waited on, in this step)
    clients.send(owner_node, "orders", [grouped(f"{group}:{n}", group) for n in (1, 2) for group in GROUPS])

    cluster.nodes[2].kill()  # -9: its stream stops answering
    started = time.monotonic()
    clients.send(owner_node, "orders", [grouped(f"{group}:3", group) for group in GROUPS], name="after-kill")
    waited_s = time.monotonic() - started
    assert waited_s >= LAG_MS / 1000 * 0.9  # a send backed by the dead node waited for the lag, then went on
    status = cluster.wait_for(lambda s: owner_row(s, owner)["in_sync"] == [ids[1]], "node 2 out of sync", via=0)
    assert owner_row(status, owner)["under_replicated"] is True  # node 2's groups are on one disk now

    cluster.nodes[1].stop()
    for index, sent in ((1, (1, 2, 3)), (2, (1, 2))):
        held = replica_bodies(cluster.nodes[index], owner)
        assert held == {group: [f"{group}:{n}" for n in sent] if group in backed[index] else [] for group in GROUPS}
