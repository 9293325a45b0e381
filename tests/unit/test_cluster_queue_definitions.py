"""How one node applies the cluster-wide queue definitions the raft feed brings (node/core/cluster/definitions.py)."""

from __future__ import annotations

from node.core.dispatch.broker import Broker
from node.core.cluster import QUEUES_MARK, ClusterProtocol
from node.core.cluster.feed import QUEUES, QUEUES_ALL
from node.core.effects import Declared, ProposeQueueSeeds, QueueDeleted
from node.core.dispatch.message import Message
from node.core.dispatch.settings import QueueSettings


def protocol(**settings) -> ClusterProtocol:
    return ClusterProtocol("n1", Broker(), handler_timeout_ms=1000, **settings)


def values(name: str = "orders", **fields) -> dict:
    return QueueSettings(name=name, **fields).to_dict()


def of(kind, effects: list) -> list:
    return [effect for effect in effects if isinstance(effect, kind)]


def fill(cluster: ClusterProtocol, name: str = "orders", count: int = 1) -> None:
    for number in range(count):
        cluster.broker.enqueue(name, Message(payload=b"x", group_id=f"g{number}"), 0)


def test_a_definition_declares_the_queue_here_and_journals_it():
    cluster = protocol()
    effects = cluster.applied(QUEUES, [(1, "orders", values(group_buckets=8))], None, 0)
    assert cluster.broker.queues["orders"].settings.group_buckets == 8
    assert Declared(cluster.broker.queues["orders"].settings.to_dict()) in effects  # journalled
    assert cluster.definitions == {"orders": values(group_buckets=8)}


def test_an_update_gives_a_live_queue_its_new_limits_and_keeps_its_messages():
    cluster = protocol()
    cluster.applied(QUEUES, [(1, "orders", values())], None, 0)
    fill(cluster, count=2)
    cluster.applied(QUEUES, [(2, "orders", values(depth_max_messages=5))], None, 0)
    queue = cluster.broker.queues["orders"]
    assert queue.settings.depth_max_messages == 5 and queue.stats()["depth_messages"] == 2


def test_a_queue_here_differing_in_a_grouping_field_keeps_its_settings_while_it_holds_messages():
    cluster = protocol()
    cluster.broker.declare_queue(QueueSettings(name="orders"))
    fill(cluster)
    cluster.applied(QUEUES, [(1, "orders", values(group_buckets=8))], None, 0)
    assert cluster.broker.queues["orders"].settings.group_buckets == -1
    assert cluster.broker.queues["orders"].stats()["depth_messages"] == 1


def test_an_empty_queue_here_differing_in_a_grouping_field_is_declared_again():
    cluster = protocol()
    cluster.broker.declare_queue(QueueSettings(name="orders"))
    cluster.applied(QUEUES, [(1, "orders", values(group_buckets=8))], None, 0)
    assert cluster.broker.queues["orders"].settings.group_buckets == 8


def test_a_deletion_drops_the_queue_and_its_messages_and_journals_its_revision():
    cluster = protocol()
    cluster.applied(QUEUES, [(1, "orders", values())], None, 0)
    fill(cluster, count=3)
    effects = cluster.applied(QUEUES, [(2, "orders", None)], None, 0)
    assert "orders" not in cluster.broker.queues
    assert of(QueueDeleted, effects) == [QueueDeleted("orders", True)]
    assert of(Declared, effects) == [Declared({"name": QUEUES_MARK, "revision": 2})]


def test_a_replayed_deletion_already_applied_before_a_restart_deletes_nothing():
    cluster = protocol()
    assert cluster.recover_declaration({"name": QUEUES_MARK, "revision": 2})
    cluster.broker.declare_queue(QueueSettings(name="orders"))  # made again after the deletion, journalled
    fill(cluster)
    assert cluster.applied(QUEUES, [(2, "orders", None)], None, 0) == []
    assert cluster.broker.queues["orders"].stats()["depth_messages"] == 1


def test_a_snapshot_applies_deletions_unseen_here_and_every_definition():
    cluster = protocol()
    cluster.broker.declare_queue(QueueSettings(name="gone"))
    cluster.broker.declare_queue(QueueSettings(name="again"))
    cluster.applied(QUEUES_ALL, (5, {"again": values("again", groups_max=3), "new": values("new")},
                                 {"gone": 4, "again": 2}), None, 0)
    assert sorted(cluster.broker.queues) == ["again", "new"]
    assert cluster.broker.queues["again"].settings.groups_max == 3
    assert cluster.definitions_applied == 5


def test_a_snapshot_this_node_applied_before_a_restart_changes_nothing_until_ready():
    cluster = protocol()
    cluster.recover_declaration({"name": QUEUES_MARK, "revision": 5})
    assert cluster.applied(QUEUES_ALL, (5, {"new": values("new")}, {}), None, 0) == []
    assert "new" not in cluster.broker.queues
    cluster.ready(0)
    assert "new" in cluster.broker.queues


def test_a_replayed_old_definition_does_not_bring_back_a_queue_deleted_since():
    cluster = protocol()
    cluster.recover_declaration({"name": QUEUES_MARK, "revision": 2})
    cluster.applied(QUEUES, [(1, "orders", values())], None, 0)
    cluster.applied(QUEUES, [(2, "orders", None)], None, 0)
    cluster.ready(0)
    assert "orders" not in cluster.broker.queues and cluster.definitions == {}


def test_once_current_a_config_file_queue_takes_the_cluster_definition_a_replay_skipped():
    cluster = protocol()
    cluster.recover_declaration({"name": QUEUES_MARK, "revision": 2})
    cluster.broker.declare_queue(QueueSettings(name="seeded", groups_max=50))  # the config file's settings
    fill(cluster, "seeded")
    cluster.applied(QUEUES, [(1, "seeded", values("seeded", groups_max=50))], None, 0)
    cluster.applied(QUEUES, [(2, "seeded", values("seeded", groups_max=60))], None, 0)
    assert cluster.broker.queues["seeded"].settings.groups_max == 50  # replaying: not yet
    cluster.ready(0)
    assert cluster.broker.queues["seeded"].settings.groups_max == 60
    assert cluster.broker.queues["seeded"].stats()["depth_messages"] == 1


def test_a_definition_this_node_cannot_read_leaves_its_queue_alone():
    cluster = protocol()
    effects = cluster.applied(QUEUES, [(1, "orders", {**values(), "group_buckets": "many"})], None, 0)
    assert [effect for effect in of(Declared, effects) if effect.values["name"] == "orders"] == []
    assert "orders" not in cluster.broker.queues


def test_config_file_queues_are_proposed_as_seeds_once_the_replica_is_current_until_they_commit():
    cluster = protocol(queue_seeds=(values("jobs"),))
    assert of(ProposeQueueSeeds, cluster.tick(0, {})) == []  # the replica is not current yet
    assert of(ProposeQueueSeeds, cluster.ready(0)) == [ProposeQueueSeeds((values("jobs"),))]
    assert of(ProposeQueueSeeds, cluster.tick(10, {})) == []  # one proposal at a time
    cluster.queue_seeds_failed(10)
    assert of(ProposeQueueSeeds, cluster.tick(500, {})) == []
    assert of(ProposeQueueSeeds, cluster.tick(1010, {})) == [ProposeQueueSeeds((values("jobs"),))]
    cluster.queues_seeded()
    assert of(ProposeQueueSeeds, cluster.tick(5000, {})) == []


def test_a_node_without_config_file_queues_proposes_no_seeds():
    cluster = protocol()
    assert of(ProposeQueueSeeds, cluster.ready(0) + cluster.tick(5000, {})) == []


def test_once_current_a_config_file_queue_deleted_cluster_wide_is_dropped_again_unless_it_holds_messages():
    cluster = protocol(queue_seeds=(values("seeded"), values("busy")))
    cluster.recover_declaration({"name": QUEUES_MARK, "revision": 4})
    for name in ("seeded", "busy"):  # declared from the config file at recovery
        cluster.broker.declare_queue(QueueSettings(name=name))
    fill(cluster, "busy")  # accepted after the deletion, into a queue made again
    cluster.applied(QUEUES_ALL, (4, {}, {"seeded": 3, "busy": 4}), None, 0)
    effects = cluster.ready(0)
    assert of(QueueDeleted, effects) == [QueueDeleted("seeded", True)]
    assert sorted(cluster.broker.queues) == ["busy"]


def test_in_transit_counts_per_queue_what_is_accepted_here_but_in_no_queue_yet():
    cluster = protocol()
    cluster.applied(QUEUES, [(1, "orders", values()), (2, "jobs", values("jobs"))], None, 0)
    for number, queue in enumerate(("orders", "orders", "jobs")):
        cluster.arrive(f"delivery{number}", queue, f"g{number}", Message(payload=b"x", group_id=f"g{number}"),
                       True, False, 0)
    assert cluster.in_transit() == {"jobs": 1, "orders": 2}  # waiting for their routes
    assert cluster.status()["in_transit"] == {"jobs": 1, "orders": 2}
