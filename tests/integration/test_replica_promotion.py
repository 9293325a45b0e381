"""Replica promotion through real raft members (issue 28, phase 2): three GroupingHandlers in this process
on 127.0.0.1, the real pysyncobj, the real leader duties thread.

The owner n1 holds routes and declares n2 in sync (replica_in_sync, which enables raft code version 3
first); then n1 stops. The leader, once n1 has been unreachable for replica_failover_ms, proposes
promote: every member's table moves exactly the routes whose first backup is n2 to n2, bumps n1's
epoch and marks it down, and each member's feed says so (REPLICAS before the ROUTES).
"""

from __future__ import annotations

import threading
import time

import pytest

from handler.code_versions import REPLICAS_CODE_VERSION
from handler.service import GroupingHandler
from node.core.cluster.feed import REPLICAS, ROUTES
from node.core.replication.assignment import promotion_target
from tests.integration.cluster import free_ports
from tests.integration.harness import wait_until

WAIT_S = 30
REPLICA_FAILOVER_MS = 300
GROUPS = [f"g{number}" for number in range(12)]


def answer(call, *args) -> tuple:
    done, outcome = threading.Event(), []

    def on_result(reason, result=None):
        outcome.append((reason, result))
        done.set()
    call(*args, on_result)
    assert done.wait(WAIT_S), f"{call.__name__} got no answer"
    return outcome[0]


@pytest.fixture
def members(tmp_path):
    ids = [f"127.0.0.1:{port}" for port in free_ports(3)]
    heard = {node: [] for node in ids}
    started = []
    for node in ids:
        ready = threading.Event()
        started.append(GroupingHandler(
            node, [other for other in ids if other != node], str(tmp_path / node.replace(":", "_")),
            on_applied=lambda kind, payload, at_ms, node=node: heard[node].append((kind, payload)),
            on_ready=ready.set, election_timeout_min_ms=200, election_timeout_max_ms=500, routes_max=1000,
            replica_failover_ms=REPLICA_FAILOVER_MS, replication_factor=2))
    wait_until(lambda: all(handler.status()["leader"] for handler in started), "a raft leader", WAIT_S)
    yield started, heard
    for handler in started:
        handler.stop()


def test_an_owner_that_stops_has_its_routes_promoted_to_its_in_sync_backup(members):
    (n1, n2, n3), heard = members
    now_ms = int(time.time() * 1000)
    for handler in (n1, n2, n3):
        assert answer(handler.register, "h:1", "h:2", "h:3", now_ms) == (None, None)
    committed = threading.Event()
    n1.touch([["q", group, n1.node_id] for group in GROUPS], now_ms, on_failed=lambda *args: None,
             on_committed=committed.set)
    assert committed.wait(WAIT_S)
    wait_until(lambda: all(len(handler.replica.table) == len(GROUPS) for handler in (n2, n3)), "the routes everywhere")

    assert answer(n1.replica_in_sync, n2.node_id, 0) == (None, True)  # n1's epoch is 0
    assert n1._syncobj.getCodeVersion() == REPLICAS_CODE_VERSION
    assert answer(n1.replica_in_sync, n2.node_id, 1) == (None, False)  # not its epoch: refused, no error
    wait_until(lambda: n3.replica.table.in_sync == {n1.node_id: [n2.node_id]}, "the in-sync set on n3")

    stopped_at = time.monotonic()
    n1.stop()
    members_ = sorted(handler.node_id for handler in (n1, n2, n3))
    expected = {("q", group): promotion_target(n1.node_id, "q", group, members_, {n2.node_id}, 2) or n1.node_id
                for group in GROUPS}
    assert set(expected.values()) == {n1.node_id, n2.node_id}  # some groups are backed by n3, not in sync
    for handler in (n2, n3):
        wait_until(lambda handler=handler: handler.replica.table.epochs == {n1.node_id: 1},
                   f"the promotion applied on {handler.node_id}", WAIT_S)
        table = handler.replica.table
        assert {key: node for key, (node, _touched_ms) in table.entries()} == expected
        assert n1.node_id in table.down and table.in_sync == {}
        kinds = [kind for kind, payload in heard[handler.node_id] if kind in (REPLICAS, ROUTES)]
        promoted = kinds.index(REPLICAS, kinds.index(REPLICAS) + 1)  # the first REPLICAS was the in-sync one
        assert kinds[promoted + 1] == ROUTES
    assert time.monotonic() - stopped_at >= REPLICA_FAILOVER_MS / 1000
