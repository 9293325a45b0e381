"""What `grouper cluster status` says of replication on a real 3-node cluster (issue 28).

The owner of a durable queue's groups streams them to their backups (node/core/replication/streams.py)
and proposes each backup in sync once it holds a copy: status then shows its in-sync backups, at epoch 0,
and "ok"; a queue asking for one copy is not replicated and never under-replicated.
(Under-replication while a backup is down: tests/integration/test_replica_streams.py.)
"""

from __future__ import annotations

from tests.integration.harness import grouped
from tests.integration.test_clustered_groups import bodies


def test_cluster_status_shows_the_owners_backups_in_sync_once_its_streams_caught_up(cluster_factory, clients):
    cluster = cluster_factory("[node]\nreplication_factor = 2\n")  # opt-in for now (handler/leader_duties.py)
    consumer = clients.consumer(cluster.nodes[2], "orders", "c2")
    cluster.wait_consumers("orders", {0: 0, 1: 0, 2: 1})
    clients.send(cluster.nodes[0], "orders", [grouped(f"g{n}:0", f"g{n}") for n in range(3)])
    assert sorted(bodies(consumer.fetch_many(3))) == ["g0:0", "g1:0", "g2:0"]
    backups = sorted(cluster.node_ids[:2])
    status = cluster.wait_for(lambda s: {m["node"]: m for m in s["members"]}[cluster.node_ids[2]]["in_sync"] == backups,
                              "the owner's backups in sync", timeout_s=10)
    members = {member["node"]: member for member in status["members"]}
    owner = members[cluster.node_ids[2]]
    assert (owner["routes"], owner["epoch"], owner["in_sync"], owner["under_replicated"]) == (3, 0, backups, False)
    assert not any(members[node]["under_replicated"] for node in cluster.node_ids[:2])
    text = cluster.nodes[1].cli("cluster", "status")
    assert text.returncode == 0, text.stderr
    [row] = [line for line in text.stdout.split("OWNER", 1)[1].splitlines() if line.startswith(cluster.node_ids[2])]
    assert row.split()[1:] == ["0", f"{backups[0]},", backups[1], "ok"]

    single = cluster.nodes[0].cli("queue", "add", "audit", "--replication-factor", "1")
    assert single.returncode == 0, single.stderr
    audit = clients.consumer(cluster.nodes[1], "audit", "c1")
    cluster.wait_consumers("audit", {0: 0, 1: 1, 2: 0})
    clients.send(cluster.nodes[0], "audit", [grouped("a:0", "a")])
    assert bodies(audit.fetch_many(1)) == ["a:0"]
    members = {member["node"]: member for member in cluster.status()["members"]}
    assert members[cluster.node_ids[1]]["routes"] == 1 and not members[cluster.node_ids[1]]["under_replicated"]
