"""What `grouper cluster status` says of replication on a real 3-node cluster (issue 28, phase 2).

No replica stream runs yet, so no backup is ever in sync: the node owning a durable queue's groups is
under-replicated at the default factor (2), at epoch 0, and says so; a queue asking for one copy is not.
"""

from __future__ import annotations

from tests.integration.harness import grouped
from tests.integration.test_clustered_groups import bodies


def test_cluster_status_names_the_owner_of_durable_groups_with_no_in_sync_backup_as_under_replicated(cluster, clients):
    consumer = clients.consumer(cluster.nodes[2], "orders", "c2")
    cluster.wait_consumers("orders", {0: 0, 1: 0, 2: 1})
    clients.send(cluster.nodes[0], "orders", [grouped(f"g{n}:0", f"g{n}") for n in range(3)])
    assert sorted(bodies(consumer.fetch_many(3))) == ["g0:0", "g1:0", "g2:0"]
    members = {member["node"]: member for member in cluster.status()["members"]}
    owner = members[cluster.node_ids[2]]
    assert (owner["routes"], owner["epoch"], owner["in_sync"], owner["under_replicated"]) == (3, 0, [], True)
    assert not any(members[node]["under_replicated"] for node in cluster.node_ids[:2])
    text = cluster.nodes[1].cli("cluster", "status")
    assert text.returncode == 0, text.stderr
    [row] = [line for line in text.stdout.split("OWNER", 1)[1].splitlines() if line.startswith(cluster.node_ids[2])]
    assert row.split()[1:] == ["0", "-", "under-replicated"]

    single = cluster.nodes[0].cli("queue", "add", "audit", "--replication-factor", "1")
    assert single.returncode == 0, single.stderr
    audit = clients.consumer(cluster.nodes[1], "audit", "c1")
    cluster.wait_consumers("audit", {0: 0, 1: 1, 2: 0})
    clients.send(cluster.nodes[0], "audit", [grouped("a:0", "a")])
    assert bodies(audit.fetch_many(1)) == ["a:0"]
    members = {member["node"]: member for member in cluster.status()["members"]}
    assert members[cluster.node_ids[1]]["routes"] == 1 and not members[cluster.node_ids[1]]["under_replicated"]
