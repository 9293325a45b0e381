"""Issue 28's settings and what a node reads of the replica sets: the queue setting replication_factor
(config tables, address settings, queue flags, the admin proto), the node config keys
replica_failover_ms and replication_factor, the cluster protocol's read-only copy of the REPLICAS feed,
and the cluster status's under-replicated verdict."""

from __future__ import annotations

import types

import pytest

from node.admin.queue_flags import queue_changes_from_args, queue_settings_from_args
from node.admin.replica_report import replica_report
from node.admin.wire import settings_from_pb
from node.cli import build_parser
from node.config import load
from node.core.cluster.feed import FIXED_FIELDS, REPLICAS, UPDATABLE_FIELDS, fixed_changes
from node.core.cluster.replicas import Replicas
from node.core.dispatch.broker import Broker
from node.core.dispatch.settings import QueueSettings
from node.core.errors import InvalidConfig
from proto import admin_pb2


# ---- the queue setting -----------------------------------------------------------------------------

def test_a_queue_without_a_replication_factor_takes_the_cluster_default_and_its_record_does_not_name_it():
    assert QueueSettings(name="q").replication_factor == 0
    assert "replication_factor" not in QueueSettings(name="q").to_dict()  # older nodes read the record
    assert QueueSettings(name="q", replication_factor=3).to_dict()["replication_factor"] == 3


@pytest.mark.parametrize("factor", [-1, 6, 100])
def test_a_replication_factor_outside_1_to_5_is_refused_naming_the_setting(factor):
    with pytest.raises(InvalidConfig) as raised:
        QueueSettings.from_dict({"name": "q", "replication_factor": factor})
    assert raised.value.key == "queue.replication_factor" and "1 to 5" in raised.value.description


def test_the_replication_factor_comes_from_address_settings_flags_and_the_admin_proto(tmp_path):
    path = tmp_path / "grouper.toml"
    path.write_text('[[address-setting]]\nmatch = "orders.#"\nreplication-factor = 3\n')
    broker = Broker(address_settings=load(str(path), environ={}).auto_create_settings())
    assert broker.queue("orders.eu", create=True).settings.replication_factor == 3
    assert broker.queue("other", create=True).settings.replication_factor == 0
    args = build_parser().parse_args(["queue", "add", "q", "--replication-factor", "2"])
    assert queue_settings_from_args("q", args).replication_factor == 2
    assert queue_changes_from_args(args) == {"replication_factor": 2}
    assert settings_from_pb(admin_pb2.QueueSettings(name="q", replication_factor=4)).replication_factor == 4


def test_a_live_queue_keeps_its_replication_factor_since_it_decides_which_nodes_back_each_group():
    assert "replication_factor" not in UPDATABLE_FIELDS and "replication_factor" not in FIXED_FIELDS
    assert fixed_changes({"name": "q"}, {"replication_factor": 3}) == ["replication_factor"]


# ---- the node config keys ----------------------------------------------------------------------------

def test_replica_failover_and_the_cluster_replication_factor_have_defaults_and_come_from_the_environment():
    config = load(environ={})
    assert (config.replica_failover_ms, config.replication_factor) == (3000, 1)  # replication opt-in for now: handler/leader_duties.py
    config = load(environ={"GROUPER_REPLICA_FAILOVER_MS": "0", "GROUPER_REPLICATION_FACTOR": "3"})
    assert (config.replica_failover_ms, config.replication_factor) == (0, 3)


@pytest.mark.parametrize("overrides, key, words", [
    ({"replica_failover_ms": -1}, "replica_failover_ms", "must be >= 0 ms"),
    ({"replication_factor": 0}, "replication_factor", "must be 1 to 5"),
    ({"replication_factor": 6}, "replication_factor", "the cluster default"),
])
def test_bad_replication_config_is_refused_naming_the_key(overrides, key, words):
    with pytest.raises(InvalidConfig) as raised:
        load(environ={}, overrides=overrides)
    assert raised.value.key == key and words in raised.value.description


# ---- the node's copy of the feed ---------------------------------------------------------------------

def test_the_protocol_keeps_the_latest_replicas_payload_as_a_read_only_copy():
    from node.core.cluster import ClusterProtocol

    protocol = ClusterProtocol("n1", Broker(), handler_timeout_ms=1000)
    assert protocol.replicas.epoch_of("n2") == 0 and protocol.replicas.in_sync_of("n2") == ()
    payload = {"epochs": {"n2": 3}, "in_sync": {"n2": ["n3", "n1"]}}
    assert protocol.applied(REPLICAS, payload, None, 5) == []
    payload["in_sync"]["n2"].append("n4")  # the payload is the replica's copy; the view keeps its own
    assert protocol.replicas.epoch_of("n2") == 3 and protocol.replicas.in_sync_of("n2") == ("n1", "n3")
    protocol.applied(REPLICAS, {"epochs": {}, "in_sync": {}}, None, 6)  # each replaces all known before
    assert protocol.replicas.epoch_of("n2") == 0 and protocol.replicas.in_sync_of("n2") == ()


def fake_cluster(routes: dict, queues: dict, definitions: dict, replicas: Replicas, down=()):
    broker = types.SimpleNamespace(queues={name: types.SimpleNamespace(settings=settings)
                                           for name, settings in queues.items()})
    return types.SimpleNamespace(broker=broker, definitions=definitions, router=types.SimpleNamespace(routes=routes),
                                 members={"down": {node: 1 for node in down}}, replicas=replicas)


def test_an_owner_of_durable_groups_with_fewer_in_sync_backups_than_the_factor_asks_is_under_replicated():
    replicas = Replicas()
    replicas.applied({"epochs": {"n1": 2}, "in_sync": {"n1": ["n2", "n3"], "n2": ["n3"]}})
    cluster = fake_cluster(
        routes={("wide", "a"): "n1", ("plain", "b"): "n2", ("memory", "c"): "n3", ("defined", "d"): "n4"},
        queues={"wide": QueueSettings(name="wide", replication_factor=3), "plain": QueueSettings(name="plain"),
                "memory": QueueSettings(name="memory", durable=False)},
        definitions={"defined": {"name": "defined", "replication_factor": 1}}, replicas=replicas, down=("n3",))
    report = replica_report(cluster, 2)
    assert report["n1"] == {"epoch": 2, "in_sync": ["n2"], "under_replicated": True}  # n3 is down: 1 of 2
    assert report["n2"] == {"epoch": 0, "in_sync": [], "under_replicated": True}  # n3 down; the default asks 1
    assert report["n3"]["under_replicated"] is False  # a non-durable queue is not replicated
    assert report["n4"]["under_replicated"] is False  # its definition asks for one copy
    assert replica_report(cluster, 1)["n2"]["under_replicated"] is False
