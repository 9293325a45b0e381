"""The owner's lease (issue 28, node/core/cluster/owner_lease.py): a node cut off from the raft leader for
replica_lease_ms delivers nothing of its replicated queues and refuses their sends, until contact returns."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from node.config import load
from node.core.cluster import ClusterProtocol
from node.core.cluster.feed import REPLICAS, ROUTES
from node.core.cluster.outbound import Entry
from node.core.cluster.owner_lease import LEASE_MARGIN_MS, OwnerLease, OwnerLeaseLapsed, check_lease
from node.core.dispatch.broker import Broker
from node.core.dispatch.message import Message
from node.core.effects import Deliver, EnqueueLocal, Refuse
from node.core.errors import InvalidConfig

LEASE_MS = 1500

# ---- the lease itself -------------------------------------------------------------------------------

events = st.lists(st.one_of(
    st.tuples(st.just("wait"), st.integers(0, 2 * LEASE_MS)),
    st.tuples(st.just("contact"), st.integers(0, 3 * LEASE_MS), st.integers(0, 200))),  # (age, answer delay)
    max_size=40)


@settings(max_examples=300, deadline=None)
@given(events)
def test_a_lease_never_serves_past_lease_ms_after_the_latest_contact_it_could_have_had(steps):
    lease = OwnerLease(LEASE_MS)
    now_ms = 10_000
    latest_true_contact_ms = None  # the member's real moment, which the node must never count later than
    for step in steps:
        if step[0] == "wait":
            now_ms += step[1]
        else:
            _, age_ms, delay_ms = step
            sent_ms = now_ms
            now_ms += delay_ms  # the answer comes back later; the member measured its age in between
            true_ms = sent_ms + delay_ms // 2 - age_ms
            latest_true_contact_ms = true_ms if latest_true_contact_ms is None else max(latest_true_contact_ms, true_ms)
            lease.contacted(sent_ms, age_ms)
        serving = lease.serving(now_ms)
        if latest_true_contact_ms is None or now_ms - latest_true_contact_ms >= LEASE_MS:
            assert not serving
        lease.review(now_ms)
        assert lease.lapsed == (not serving)


def test_a_lease_starts_lapsed_without_contact_and_one_contact_serves_until_lease_ms():
    lease = OwnerLease(LEASE_MS)
    assert not lease.serving(0) and lease.lapsed and lease.review(0) is None
    lease.contacted(1000, 100)  # heard 100 ms before the question sent at 1000
    assert lease.serving(900 + LEASE_MS - 1)
    assert not lease.serving(900 + LEASE_MS)
    lease.contacted(500, 0)  # an older answer arriving late counts for nothing
    assert not lease.serving(900 + LEASE_MS)
    assert lease.review(1000) is False and lease.review(900 + LEASE_MS) is True
    assert lease.review(900 + LEASE_MS) is None
    lease.contacted(3000, 0)
    assert lease.review(3001) is False


def test_no_lease_always_serves():
    lease = OwnerLease(0)
    assert lease.serving(10**9) and not lease.lapsed and lease.review(10**9) is None


# ---- config -----------------------------------------------------------------------------------------

def test_the_default_lease_fits_below_the_default_failover_with_the_raft_fallback_and_margin():
    config = load(environ={}, overrides={})
    assert config.replica_lease_ms == config.replica_failover_ms // 2 == 1500
    assert config.replica_lease_ms + 2 * config.election_timeout_max_ms + LEASE_MARGIN_MS <= config.replica_failover_ms


@pytest.mark.parametrize("overrides", [
    {"replica_lease_ms": 2000},  # 2000 + 1000 + 250 > 3000
    {"replica_lease_ms": 0},  # promotion on and no lease
    {"replica_failover_ms": 2000},  # the default lease no longer fits
])
def test_a_lease_that_would_outlast_the_promotion_is_refused_by_name(overrides):
    with pytest.raises(InvalidConfig) as raised:
        load(environ={}, overrides=overrides)
    assert raised.value.key == "replica_lease_ms"


@given(st.integers(0, 20_000), st.integers(1, 20_000), st.integers(1, 5000))
def test_check_lease_accepts_exactly_the_leases_that_end_first(lease_ms, failover_ms, election_max_ms):
    fits = 1 <= lease_ms <= failover_ms - 2 * election_max_ms - LEASE_MARGIN_MS
    assert (check_lease(lease_ms, failover_ms, 2 * election_max_ms) is None) == fits


def test_without_promotion_no_lease_is_needed():
    assert check_lease(0, 0, 1000) is None
    assert load(environ={}, overrides={"replica_failover_ms": 0, "replica_lease_ms": 0}).replica_lease_ms == 0


# ---- the gate: dispatch held and sends refused for replicated queues only ---------------------------

def protocol() -> ClusterProtocol:
    broker = Broker()
    broker.queue("replicated", create=True, parameters={"replication_factor": 2})
    broker.queue("single", create=True)
    cluster = ClusterProtocol("n1", broker, handler_timeout_ms=1000, owner_lease_ms=LEASE_MS,
                              replication_factor_default=1)
    cluster.ready(0)
    return cluster


def test_a_lapsed_owner_delivers_nothing_of_a_replicated_queue_until_contact_returns():
    cluster = protocol()
    broker = cluster.broker
    cluster.lease.contacted(0, 0)
    assert cluster.lease.review(0, 0, []) is False  # serving from the first contact
    broker.enqueue("replicated", Message(b"a", "g1"), 0)
    broker.enqueue("single", Message(b"b", "g1"), 0)
    effects: list = []
    assert cluster.lease.review(LEASE_MS, 0, effects) is True  # lapsed
    broker.attach_consumer("replicated", "c1", False, 0)
    broker.attach_consumer("single", "c2", False, 0)
    assert [d.consumer_id for d in broker.set_credit("c1", 10, 0) if isinstance(d, Deliver)] == []
    assert [d.consumer_id for d in broker.set_credit("c2", 10, 0) if isinstance(d, Deliver)] == ["c2"]
    cluster.lease.contacted(LEASE_MS + 100, 0)
    effects = []
    assert cluster.lease.review(LEASE_MS + 100, 0, effects) is False
    assert [d.message.payload for d in effects if isinstance(d, Deliver)] == [b"a"]


def test_a_lapsed_owner_refuses_sends_and_forwarded_batches_of_replicated_queues_naming_the_lease():
    cluster = protocol()
    cluster.applied(ROUTES, [("replicated", "g1", "n1"), ("single", "g1", "n1")], 0, 0)
    cluster.lease.contacted(0, 0)
    cluster.lease.review(LEASE_MS, 0, [])
    refused = [e for e in cluster.arrive("in", "replicated", "g1", Message(b"a", "g1"), True, False, 0)
               if isinstance(e, Refuse)]
    assert len(refused) == 1 and isinstance(refused[0].error, OwnerLeaseLapsed)
    assert refused[0].error.retriable and "replica_lease_ms=1500" in refused[0].error.description
    assert any(isinstance(e, EnqueueLocal) for e in cluster.arrive("in", "single", "g1", Message(b"b", "g1"),
                                                                   True, False, 0))
    replies = []
    entry = Entry(1, "replicated", "g1", b"x", 0, False, 0)
    assert cluster.forward_received("n2", [entry], lambda high_water, error: replies.append(error), 0) == []
    assert isinstance(replies[0], OwnerLeaseLapsed)


def test_a_lapsed_owner_promoted_away_meanwhile_serves_again_only_after_fencing_held_what_it_lost():
    cluster = protocol()
    cluster.lease.contacted(0, 0)
    cluster.lease.review(LEASE_MS, 0, [])  # lapsed
    cluster.applied(REPLICAS, {"epochs": {"n1": 1}, "in_sync": {}}, None, 0)  # promoted away meanwhile
    cluster.lease.contacted(LEASE_MS + 100, 0)  # contact is back
    assert cluster.lease.review(LEASE_MS + 100, 0, []) is None and cluster.lease.lease.lapsed
    cluster.tick(0, {})  # fencing: nothing of the lost groups here, so the new epoch is the one served with
    assert cluster.lease.review(LEASE_MS + 100, 0, []) is False
