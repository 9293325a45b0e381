"""The node's cluster link tells its replica writer the owner epochs of every REPLICAS it applies (issue 28):
a fenced owner that comes back and streams at the epoch it had (a reset first) must be refused by its old
backups before their replica journals, which a takeover may still have to read, are emptied."""

from __future__ import annotations

import pytest

from node.cluster import ClusterLink
from node.core.cluster.feed import REPLICAS, ROUTES
from node.store.replica_journal import StaleEpoch
from node.store.replica_writer import ReplicaWriter

OWNER = "127.0.0.1:7001"


class _Protocol:
    def __init__(self):
        self.applied_kinds = []

    def applied(self, kind, payload, at_ms, now_ms):
        self.applied_kinds.append(kind)
        return []


class _Proposals:
    claimed_ns = 0


def link_with_writer(tmp_path) -> ClusterLink:
    """A ClusterLink's feed handling alone: its protocol, server and shell stand-ins take every effect."""
    link = ClusterLink.__new__(ClusterLink)
    link.protocol = _Protocol()
    link.proposals = _Proposals()
    link.replicas = ReplicaWriter(str(tmp_path), "127.0.0.1:7002")
    link.clock_ms = lambda: 0
    link.carry_out = lambda effects: None
    return link


def test_a_replicas_payload_raises_the_writers_epoch_floor_before_the_protocol_hears_it(tmp_path):
    link = link_with_writer(tmp_path)
    link.applied(REPLICAS, {"epochs": {OWNER: 1}, "in_sync": {}}, 0)
    assert link.protocol.applied_kinds == [REPLICAS]
    with pytest.raises(StaleEpoch) as raised:  # refused before a job is queued: no writer thread needed
        link.replicas.submit(OWNER, 0, [], 1000, reset=True)
    assert "epoch 1 the route table gives it" in str(raised.value)


def test_other_feed_kinds_leave_the_writers_epochs_alone(tmp_path):
    link = link_with_writer(tmp_path)
    link.applied(REPLICAS, {"epochs": {OWNER: 2}, "in_sync": {}}, 0)
    link.applied(ROUTES, {}, 0)
    with pytest.raises(StaleEpoch):
        link.replicas.submit(OWNER, 1, [], 1000)
    link.applied(REPLICAS, {"in_sync": {}}, 0)  # a copy with no epochs: every owner at 0 again
    assert link.replicas._table_epochs == {}
