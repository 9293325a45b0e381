"""Queues a node makes on a client's behalf become cluster-wide definitions, and subscriptions whose
link ended, or whose node is gone, are deleted cluster-wide (node/core/cluster/definitions.py)."""

from __future__ import annotations

import pytest

from node.core.dispatch.broker import Broker
from node.core.cluster import ClusterProtocol
from node.core.cluster.definitions import DEFINITION_RETRY_INTERVAL_MS
from node.core.cluster.feed import ADDED, CONFLICT, MEMBERS, QUEUES, TEMPORARY_OF
from node.core.effects import DetachConsumer, ProposeClaim, ProposeDefinition, ProposeQueueDeletion
from node.core.errors import AlreadyExists, GrouperError
from node.core.dispatch.message import Message
from node.core.dispatch.settings import QueueSettings


def protocol(node_id: str = "n1") -> ClusterProtocol:
    cluster = ClusterProtocol(node_id, Broker(), handler_timeout_ms=1000)
    cluster.ready(0)
    return cluster


def of(kind, effects: list) -> list:
    return [effect for effect in effects if isinstance(effect, kind)]


def committed(cluster: ClusterProtocol, values: dict, revision: int) -> list:
    """The feed brings the definition, then the proposer hears it was added (as the adapter sees it)."""
    effects = cluster.applied(QUEUES, [(revision, values["name"], values)], None, 0)
    return effects + cluster.definition_proposed(values, None, ADDED, values, 0)


def test_a_queue_an_attach_auto_creates_with_parameters_is_proposed_before_the_claims_of_its_batch():
    cluster = protocol()
    cluster.broker.queue("orders", create=True, parameters={"group_buckets": 8})
    cluster.arrive("incoming", "orders", "g1", Message(b"x", "g1"), False, False, 0)
    effects = cluster.quiesced(0)
    assert [type(effect) for effect in effects] == [ProposeDefinition, ProposeClaim]
    assert effects[0].values == QueueSettings(name="orders", group_buckets=8).to_dict()
    assert cluster.quiesced(0) == []  # proposed once


def test_a_node_alone_records_nothing():
    broker = Broker()
    broker.queue("orders", create=True)
    broker.subscribe("prices", "app.live.1", durable=False)
    broker.unsubscribe("app.live.1")
    assert broker.local is None


def test_a_queue_the_cluster_defines_already_is_not_proposed_and_a_refused_send_proposes_nothing():
    cluster = protocol()
    cluster.applied(QUEUES, [(1, "orders", QueueSettings(name="orders").to_dict())], None, 0)
    cluster.broker.queue("orders", create=True)
    cluster.broker.queue("limited", create=True, parameters={"depth_max_messages": 1})
    cluster.quiesced(0)
    with pytest.raises(GrouperError):
        cluster.broker.enqueue("fresh", Message(b"x", "g" * 100_000), 0)  # a group id past its limit
    assert "fresh" not in cluster.broker.queues
    assert cluster.quiesced(0) == []


def test_a_temporary_subscription_names_its_node_and_is_deleted_cluster_wide_when_its_link_ends():
    cluster = protocol()
    cluster.broker.subscribe("prices", "app.live.1", durable=False)
    (proposal,) = cluster.quiesced(0)
    assert proposal.values[TEMPORARY_OF] == "n1" and proposal.values["address"] == "prices"
    committed(cluster, proposal.values, 1)
    cluster.broker.unsubscribe("app.live.1")
    assert cluster.quiesced(0) == [ProposeQueueDeletion("app.live.1", 1)]
    assert cluster.deletion_proposed("app.live.1", None, 0) == []
    assert not of(ProposeQueueDeletion, cluster.tick(DEFINITION_RETRY_INTERVAL_MS * 2, {}))


def test_a_link_ending_before_its_definition_committed_deletes_it_once_it_did():
    cluster = protocol()
    cluster.broker.subscribe("prices", "app.live.1", durable=False)
    (proposal,) = cluster.quiesced(0)
    cluster.broker.unsubscribe("app.live.1")
    assert cluster.quiesced(0) == []  # the definition first
    effects = committed(cluster, proposal.values, 1)
    assert of(ProposeQueueDeletion, effects) == [ProposeQueueDeletion("app.live.1", 1)]


def test_a_failed_proposal_is_made_again_after_the_retry_interval_and_a_failed_deletion_too():
    cluster = protocol()
    cluster.broker.queue("orders", create=True)
    (proposal,) = cluster.quiesced(0)
    assert cluster.definition_proposed(proposal.values, "no leader", None, None, 10) == []
    assert not of(ProposeDefinition, cluster.tick(10 + DEFINITION_RETRY_INTERVAL_MS - 1, {}))
    assert of(ProposeDefinition, cluster.tick(10 + DEFINITION_RETRY_INTERVAL_MS, {})) == [proposal]
    committed(cluster, proposal.values, 1)
    cluster.broker.subscribe("prices", "app.live.1", durable=True)
    (durable,) = cluster.quiesced(0)
    assert TEMPORARY_OF not in durable.values
    committed(cluster, durable.values, 2)
    cluster.broker.unsubscribe("app.live.1")  # a durable subscription closed
    (deletion,) = cluster.quiesced(0)
    cluster.deletion_proposed("app.live.1", "no leader", 20)
    assert of(ProposeQueueDeletion, cluster.tick(20 + DEFINITION_RETRY_INTERVAL_MS, {})) == [deletion]


def test_every_node_deletes_the_temporary_subscriptions_of_a_node_marked_down():
    cluster = protocol("n1")
    theirs = dict(QueueSettings(name="app.live.1", address="prices", durable=False).to_dict(), **{TEMPORARY_OF: "n2"})
    durable = QueueSettings(name="app.keep", address="prices").to_dict()
    cluster.applied(QUEUES, [(1, "app.live.1", theirs), (2, "app.keep", durable)], None, 0)
    assert cluster.broker.queues["app.live.1"].settings.address == "prices"  # the settings alone apply
    cluster.applied(MEMBERS, {"nodes": {}, "consumers": {}, "down": {"n2": 5}}, None, 5)
    assert of(ProposeQueueDeletion, cluster.tick(10, {})) == [ProposeQueueDeletion("app.live.1", 2)]


def test_a_restarted_node_deletes_its_own_temporary_subscriptions_no_link_holds_any_more():
    cluster = ClusterProtocol("n1", Broker(), handler_timeout_ms=1000)
    mine = dict(QueueSettings(name="app.live.1", address="prices", durable=False).to_dict(), **{TEMPORARY_OF: "n1"})
    cluster.applied(QUEUES, [(1, "app.live.1", mine)], None, 0)  # replayed before the replica is current
    assert of(ProposeQueueDeletion, cluster.ready(0)) == [ProposeQueueDeletion("app.live.1", 1)]


def test_a_conflicting_definition_replaces_an_empty_queue_made_here():
    cluster = protocol()
    cluster.broker.queue("orders", create=True, parameters={"group_buckets": 16})
    (proposal,) = cluster.quiesced(0)
    held = QueueSettings(name="orders", group_buckets=8).to_dict()
    cluster.definitions["orders"] = held  # the feed brought it while this node's queue had its link
    cluster.definition_proposed(proposal.values, None, CONFLICT, held, 0)
    assert cluster.broker.queues["orders"].settings.group_buckets == 8


def test_consumers_of_an_empty_queue_made_here_that_lost_to_another_definition_are_detached_saying_so():
    cluster = protocol()
    cluster.broker.queue("orders", create=True, parameters={"group_buckets": 16})
    cluster.broker.attach_consumer("orders", "c1", False, 0)
    (proposal,) = cluster.quiesced(0)
    held = QueueSettings(name="orders", group_buckets=8).to_dict()
    cluster.definitions["orders"] = held
    effects = cluster.definition_proposed(proposal.values, None, CONFLICT, held, 0)
    (detach,) = of(DetachConsumer, effects)
    assert isinstance(detach.error, AlreadyExists) and "group_buckets differ" in detach.error.description
    assert cluster.broker.queues["orders"].settings.group_buckets == 8 and not cluster.broker.queues["orders"].consumers


def test_a_forward_reaching_a_subscription_whose_link_ended_here_does_not_define_it_again():
    cluster = protocol()
    cluster.broker.subscribe("prices", "app.live.1", durable=False)
    (proposal,) = cluster.quiesced(0)
    committed(cluster, proposal.values, 1)
    cluster.broker.unsubscribe("app.live.1")
    # another node routed a copy here before the deletion committed: the owner auto-creates the name
    cluster.broker.enqueue("app.live.1", Message(b"x", "g1"), 0)
    assert cluster.quiesced(0) == [ProposeQueueDeletion("app.live.1", 1)]
    assert "app.live.1" in cluster.pending_definitions
    effects = cluster.applied(QUEUES, [(2, "app.live.1", None)], None, 0)
    cluster.deletion_proposed("app.live.1", None, 0)
    assert "app.live.1" not in cluster.broker.queues and effects
    assert cluster.pending_definitions == set()


def test_a_queue_recovered_from_the_journal_whose_definition_never_committed_is_proposed_once_current():
    cluster = ClusterProtocol("n1", Broker(), handler_timeout_ms=1000,
                              queue_seeds=(QueueSettings(name="seeded").to_dict(),))
    for name in ("orders", "seeded", "gone", "defined"):
        cluster.broker.declare_queue(QueueSettings(name=name))  # Node.recover: journalled declarations
    cluster.hold_recovered()
    cluster.applied(QUEUES, [(1, "defined", QueueSettings(name="defined").to_dict())], None, 0)
    cluster.applied(QUEUES, [(2, "gone", None)], None, 0)
    cluster.broker.declare_queue(QueueSettings(name="gone"))  # a torn tail lost its deletion's record
    proposals = of(ProposeDefinition, cluster.ready(0))
    assert proposals == [ProposeDefinition(QueueSettings(name="orders").to_dict())]


def test_a_link_ending_after_its_definition_committed_but_before_the_replica_here_applied_it_still_deletes_it():
    cluster = protocol()
    cluster.broker.subscribe("prices", "app.live.1", durable=False)
    (proposal,) = cluster.quiesced(0)
    cluster.definition_proposed(proposal.values, None, ADDED, proposal.values, 0)  # the answer came first
    cluster.broker.unsubscribe("app.live.1")
    assert cluster.quiesced(0) == []
    cluster.applied(QUEUES, [(1, "app.live.1", proposal.values)], None, 0)
    assert of(ProposeQueueDeletion, cluster.tick(1, {})) == [ProposeQueueDeletion("app.live.1", 1)]
