"""Examples of the node's route cache and transit bookkeeping: Router, Outbound, Inbound.

Items are plain strings ("a1" is the first message of group a); keys are (queue, group) pairs. The
Router is ready unless a test says otherwise; time is whatever integer the test passes.
"""

from __future__ import annotations

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from node.core.cluster.outbound import Outbound
from node.core.cluster.routing import Inbound, Router, Routes

A = ("q", "a")
B = ("q", "b")
TIMEOUT_MS = 100


def ready_router(lease_ms: int = 0) -> Router:
    router = Router("n1", TIMEOUT_MS, lease_ms)
    router.become_ready(0)
    return router


# ---- Router: waiting for a claim -------------------------------------------------------------------

def test_a_message_of_an_unknown_group_waits_and_its_group_is_claimed_once():
    router = ready_router()
    assert router.route(A, "a1", 0) is None
    assert router.route(A, "a2", 1) is None
    assert router.take_claims() == [A]
    assert router.take_claims() == []
    assert router.waiting_count() == 2


def test_waiting_messages_are_released_in_arrival_order_when_the_route_is_learned():
    router = ready_router()
    router.route(A, "a1", 0)
    router.route(B, "b1", 1)
    router.route(A, "a2", 2)
    assert router.learn([("q", "a", "n2")], 5) == [("n2", "a1"), ("n2", "a2")]
    assert router.waiting_count() == 1
    assert router.route(A, "a3", 6) == "n2"


def test_one_learned_batch_releases_each_group_in_the_order_the_log_decided_them():
    router = ready_router()
    router.route(A, "a1", 0)
    router.route(B, "b1", 1)
    released = router.learn([("q", "b", "n3"), ("q", "a", "n2")], 5)
    assert released == [("n3", "b1"), ("n2", "a1")]


def test_a_known_route_is_returned_at_once_without_a_claim():
    router = ready_router()
    router.learn([("q", "a", "n2")], 0)
    assert router.route(A, "a1", 1) == "n2"
    assert router.take_claims() == []


def test_a_message_of_a_waiting_group_waits_behind_it_even_when_the_route_is_known():
    # the route is known (learned before the ready replica saw the claim's outcome) but a1 still
    # waits: a2 must not overtake it
    router = Router("n1", TIMEOUT_MS)
    router.route(A, "a1", 0)  # not ready: waits without a claim
    router.learn([("q", "a", "n2")], 1)  # learned during replay: not released yet
    assert router.route(A, "a2", 2) is None
    assert router.become_ready(3) == [("n2", "a1"), ("n2", "a2")]


def test_a_route_learned_for_another_group_releases_nothing_of_this_one():
    router = ready_router()
    router.route(A, "a1", 0)
    assert router.learn([("q", "b", "n2")], 1) == []
    assert router.waiting_count() == 1


def test_a_removed_route_makes_the_next_message_wait_for_a_new_claim():
    router = ready_router()
    router.learn([("q", "a", "n2")], 0)
    router.learn([("q", "a", None)], 1)
    assert router.route(A, "a1", 2) is None
    assert router.take_claims() == [A]


# ---- Router: timeouts --------------------------------------------------------------------------------

def test_expire_returns_only_the_items_whose_route_was_not_decided_in_time():
    router = ready_router()
    router.route(A, "a1", 0)
    router.route(B, "b1", 50)
    assert router.expire(TIMEOUT_MS - 1) == []
    assert router.expire(TIMEOUT_MS) == ["a1"]
    assert router.waiting_count() == 1
    assert router.expire(50 + TIMEOUT_MS) == ["b1"]


def test_messages_behind_a_timed_out_one_time_out_with_it():
    router = ready_router()
    router.route(A, "a1", 0)
    router.route(A, "a2", 90)
    assert router.expire(TIMEOUT_MS) == ["a1", "a2"]


def test_a_group_decided_in_time_never_expires():
    router = ready_router()
    router.route(A, "a1", 0)
    router.learn([("q", "a", "n2")], 10)
    assert router.expire(10 * TIMEOUT_MS) == []


def test_a_route_learned_after_the_timeout_does_not_release_already_expired_items():
    router = ready_router()
    router.route(A, "a1", 0)
    assert router.expire(TIMEOUT_MS) == ["a1"]
    assert router.learn([("q", "a", "n2")], TIMEOUT_MS + 1) == []
    assert router.route(A, "a2", TIMEOUT_MS + 2) == "n2"


def test_a_new_claim_of_the_same_group_keeps_its_own_deadline():
    router = ready_router()
    router.route(A, "a1", 0)
    router.expire(TIMEOUT_MS)
    router.route(A, "a2", TIMEOUT_MS + 50)
    assert router.expire(TIMEOUT_MS + 60) == []  # the old deadline belongs to the expired claim
    assert router.expire(2 * TIMEOUT_MS + 50) == ["a2"]


def test_a_failed_claim_is_proposed_again_only_for_groups_still_waiting():
    router = ready_router()
    router.route(A, "a1", 0)
    router.route(B, "b1", 0)
    router.take_claims()
    router.learn([("q", "b", "n2")], 1)
    router.claim_failed([A, B])
    assert router.take_claims() == [A]


def test_give_up_returns_the_refused_groups_items_and_forgets_the_claim():
    router = ready_router()
    router.route(A, "a1", 0)
    router.route(A, "a2", 1)
    assert router.give_up(A) == ["a1", "a2"]
    assert router.give_up(A) == []
    assert router.expire(TIMEOUT_MS + 1) == []


# ---- Router: not ready (the replica replays its log) -------------------------------------------------

def test_a_router_that_is_not_ready_waits_without_claiming_even_for_a_known_route():
    router = Router("n1", TIMEOUT_MS)
    router.learn([("q", "a", "n2")], 0)
    assert router.route(A, "a1", 1) is None
    assert router.route(B, "b1", 1) is None
    assert router.take_claims() == []


def test_become_ready_releases_groups_with_a_route_and_claims_the_others():
    router = Router("n1", TIMEOUT_MS)
    router.route(A, "a1", 0)
    router.route(B, "b1", 1)
    router.learn([("q", "a", "n2")], 2)
    assert router.become_ready(3) == [("n2", "a1")]
    assert router.take_claims() == [B]
    assert router.expire(TIMEOUT_MS + 10) == ["b1"]  # the released group has no deadline left


def test_a_failed_claim_is_not_retried_before_ready():
    router = Router("n1", TIMEOUT_MS)
    router.route(A, "a1", 0)
    router.claim_failed([A])
    assert router.take_claims() == []


def test_items_time_out_while_the_replica_is_still_replaying():
    router = Router("n1", TIMEOUT_MS)
    router.route(A, "a1", 0)
    assert router.expire(TIMEOUT_MS) == ["a1"]
    assert router.become_ready(TIMEOUT_MS + 1) == []
    assert router.take_claims() == []


# ---- Router: leases (a group timeout is set) ---------------------------------------------------------

def test_a_route_within_its_lease_is_used_and_reported_as_used():
    router = ready_router(lease_ms=50)
    router.learn([("q", "a", "n2")], 100)
    assert router.route(A, "a1", 150) == "n2"
    assert router.take_used() == {A}
    assert router.take_used() == set()


def test_a_stale_route_is_reclaimed_and_its_messages_wait_for_the_refresh():
    router = ready_router(lease_ms=50)
    router.learn([("q", "a", "n2")], 100)
    assert router.route(A, "a1", 151) is None
    assert router.take_claims() == [A]
    assert router.learn([("q", "a", "n2")], 160) == [("n2", "a1")]
    assert router.route(A, "a2", 170) == "n2"


def test_a_refresh_learned_later_extends_the_lease():
    router = ready_router(lease_ms=50)
    router.learn([("q", "a", "n2")], 100)
    router.learn([("q", "a", "n2")], 140)
    assert router.route(A, "a1", 190) == "n2"


def test_become_ready_reclaims_a_stale_route_instead_of_releasing_to_it():
    router = Router("n1", TIMEOUT_MS, lease_ms=50)
    router.learn([("q", "a", "n2")], 0)
    router.route(A, "a1", 10)
    assert router.become_ready(60) == []
    assert router.take_claims() == [A]


def test_routes_name_the_groups_of_a_queue_that_one_node_owns():
    routes = Routes()
    routes.put(("q", "a"), "n1", 5)
    routes.put(("q", "b"), "n2", 5)
    routes.put(("q", "c"), "n1", 9)
    routes.put(("other", "d"), "n1", 5)
    assert sorted(routes.groups_of("q", "n1")) == ["a", "c"]
    assert list(routes.groups_of("q", "n3")) == [] and list(routes.groups_of("none", "n1")) == []
    routes.put(("q", "a"), "n2", 7)  # moved on
    assert list(routes.groups_of("q", "n1")) == ["c"]


def test_routes_without_a_group_timeout_never_go_stale():
    router = ready_router()
    router.learn([("q", "a", "n2")], 0)
    assert router.route(A, "a1", 10**9) == "n2"
    assert router.take_used() == set()


# ---- Router: the digest drills compare across replicas ----------------------------------------------

def test_the_routes_digest_depends_on_the_routes_not_on_the_order_they_were_learned():
    first, second = ready_router(), ready_router()
    first.learn([("q", "a", "n1"), ("q", "b", "n2")], 0)
    second.learn([("q", "b", "n2"), ("q", "a", "n1")], 0)
    assert first.digest() == second.digest()
    assert first.digest() != ready_router().digest()


def test_the_routes_digest_changes_when_one_owner_differs_or_a_route_is_dropped():
    router = ready_router()
    router.learn([("q", "a", "n1"), ("q", "b", "n2")], 0)
    before = router.digest()
    router.learn([("q", "b", "n3")], 1)
    moved = router.digest()
    router.learn([("q", "b", None)], 2)
    assert len({before, moved, router.digest()}) == 3


def test_the_routes_digest_keeps_queue_group_and_owner_apart():
    joined, split = ready_router(), ready_router()
    joined.learn([("q", "ab", "n1")], 0)
    split.learn([("qa", "b", "n1")], 0)
    assert joined.digest() != split.digest()


# ---- Outbound ----------------------------------------------------------------------------------------

def test_acknowledge_drops_up_to_the_high_water_in_seq_order_and_returns_journalled_names_only():
    outbound = Outbound()
    outbound.add("n2", 3, A, "out-a", 10)
    outbound.add("n2", 5, B, None, 20)
    outbound.add("n2", 8, A, "out-a", 40)
    outbound.add("n3", 4, A, "out-n3", 80)
    assert outbound.acknowledge("n2", 6) == [("out-a", 3)]
    assert outbound.depths() == {"n2": 1, "n3": 1}
    assert outbound.acknowledge("n2", 8) == [("out-a", 8)]
    assert outbound.depths() == {"n3": 1}


def test_an_old_or_repeated_acknowledgement_drops_nothing_more():
    outbound = Outbound()
    outbound.add("n2", 3, A, "out-a", 10)
    outbound.add("n2", 7, A, "out-a", 10)
    assert outbound.acknowledge("n2", 3) == [("out-a", 3)]
    assert outbound.acknowledge("n2", 3) == []
    assert outbound.acknowledge("n2", 1) == []
    assert outbound.acknowledge("n9", 100) == []
    assert outbound.depths() == {"n2": 1}


def test_outbound_names_the_owner_of_every_group_waiting_in_a_channel():
    outbound = Outbound()
    outbound.add("n2", 1, A, None, 1)
    outbound.add("n3", 2, B, None, 1)
    assert outbound.owners_by_key() == {A: "n2", B: "n3"}
    outbound.acknowledge("n2", 1)
    assert outbound.owners_by_key() == {B: "n3"}


def test_outbound_counts_each_owners_messages_and_bytes_all_and_journalled_until_they_leave():
    outbound = Outbound()
    outbound.add("n2", 3, A, "out-a", 10)
    outbound.add("n2", 5, B, None, 20)  # not durable: in memory only
    outbound.add("n3", 4, A, "out-n3", 80)
    assert outbound.stats() == {
        "n2": {"messages": 2, "bytes": 30, "memory_messages": 2, "memory_bytes": 30, "journal_messages": 1,
               "journal_bytes": 10},
        "n3": {"messages": 1, "bytes": 80, "memory_messages": 1, "memory_bytes": 80, "journal_messages": 1,
               "journal_bytes": 80}}
    assert outbound.total_bytes == 110
    outbound.acknowledge("n2", 3)
    outbound.forget("n3", [4])
    assert outbound.stats()["n2"]["bytes"] == 20 and outbound.stats()["n2"]["journal_bytes"] == 0
    assert "n3" not in outbound.stats() and outbound.total_bytes == 20
    outbound.acknowledge("n2", 5)
    assert outbound.stats() == {} and outbound.total_bytes == 0
    assert outbound.depth_bytes == outbound.journal_bytes == outbound.journal_messages == {}  # no zeros kept


# ---- Inbound -----------------------------------------------------------------------------------------

def test_inbound_takes_each_forward_seq_once_per_source():
    inbound = Inbound()
    assert inbound.fresh("n2", 1)
    inbound.advance("n2", 4)
    assert not inbound.fresh("n2", 4)
    assert not inbound.fresh("n2", 2)
    assert inbound.fresh("n2", 5)
    assert inbound.fresh("n3", 1)  # high water is per source


def test_inbound_high_water_never_goes_back():
    inbound = Inbound()
    inbound.advance("n2", 9)
    inbound.advance("n2", 3)
    assert inbound.high_water == {"n2": 9}


def test_a_route_learned_from_an_old_log_entry_is_leased_from_that_entry_not_from_when_it_was_learned():
    router = Router("n1", TIMEOUT_MS, lease_ms=50)
    router.learn([("q", "a", "n2")], 100)  # replayed at t=1000 from an entry that refreshed it at t=100
    router.become_ready(1000)
    assert router.route(A, "a1", 1001) is None  # past 100 + 50: claim (refresh) first, it may be gone
    assert router.take_claims() == [A]


def test_a_route_is_trusted_until_its_refresh_time_plus_the_lease_and_not_a_moment_longer():
    router = ready_router(lease_ms=50)
    router.learn([("q", "a", "n2")], 960)  # learned later than t=960, which is when the log refreshed it
    assert router.route(A, "a1", 1010) == "n2"
    assert router.route(A, "a2", 1011) is None
    assert router.take_claims() == [A]


# ---- Router: what became of the waits (metrics) ------------------------------------------------

def test_route_decisions_are_counted_by_outcome_with_the_wait_of_each_routed_one():
    router = ready_router()
    router.route(A, "a1", 10)
    router.route(A, "a2", 20)  # waits behind a1: one decision for the group, timed from a1
    router.route(B, "b1", 10)
    router.learn([("q", "a", "n2")], now_ms=0, decided_at_ms=35)  # a lease clock must not time the wait
    assert router.decisions == {"routed": 1, "timed_out": 0, "refused": 0}
    tally = router.decision_latency.snapshot()
    assert tally["count"] == 1 and tally["sum_ms"] == 25
    router.expire(10 + TIMEOUT_MS)
    router.route(("q", "c"), "c1", 200)
    router.give_up(("q", "c"))
    router.give_up(("q", "never-waited"))
    assert router.decisions == {"routed": 1, "timed_out": 1, "refused": 1}
    assert router.waiting_since_ms == {}


# ---- Routes: the packed copy against a dict model ----------------------------------------------------

ROUTE_KEYS = st.tuples(st.sampled_from(["q", "r", "q\udc00"]), st.text(alphabet="ab\x00é", max_size=3))
OWNERS = st.sampled_from(["n1", "n2", "n3:5674"])


class RoutesMachine(RuleBasedStateMachine):
    """Routes learned, replaced (another owner, a later refresh) and removed, as the applied feed
    brings them, read back as the {(queue, group): (owner, refreshed_ms)} dict it stands for."""

    @initialize()
    def start(self):
        self.routes = Routes()
        self.model: dict = {}

    @rule(key=ROUTE_KEYS, owner=OWNERS, refreshed_ms=st.integers(-5, 1 << 50))
    def put(self, key, owner, refreshed_ms):
        self.routes.put(key, owner, refreshed_ms)
        self.model[key] = (owner, min(max(refreshed_ms, 0), (1 << 48) - 1))

    @rule(key=ROUTE_KEYS)
    def remove(self, key):
        self.routes.remove(key)
        self.model.pop(key, None)

    @rule(key=ROUTE_KEYS)
    def read(self, key):
        owner, refreshed_ms = self.model.get(key, (None, None))
        assert self.routes.get(key) == owner and self.routes.refreshed(key) == refreshed_ms
        assert (key in self.routes) == (key in self.model)
        if owner is None:
            assert self.routes.packed(key) is None
            with pytest.raises(KeyError):
                self.routes[key]
        else:
            assert self.routes[key] == owner

    @invariant()
    def same_as_the_model(self):
        assert len(self.routes) == len(self.model)
        assert dict(self.routes.items()) == {key: owner for key, (owner, _) in self.model.items()}
        assert sorted(self.routes) == sorted(self.model)
        assert sorted(self.routes.values()) == sorted(owner for owner, _ in self.model.values())
        assert all(groups for groups in self.routes.by_queue.values())  # an emptied queue is dropped


TestRoutes = RoutesMachine.TestCase
TestRoutes.settings = settings(max_examples=100, stateful_step_count=40, deadline=None, derandomize=True,
                               database=None)


def test_a_leased_router_routes_through_the_packed_refresh_time():
    router = Router("n1", TIMEOUT_MS, lease_ms=10)
    router.become_ready(0)
    router.learn([("q", "a", "n2")], 100)
    assert router.route(A, "a1", 110) == "n2" and router.take_used() == {A}
    assert router.route(A, "a2", 111) is None  # the lease ran out: it waits and is claimed again
    assert router.take_claims() == [A]


def test_a_key_without_a_group_id_has_no_route_and_breaks_nothing():
    router = ready_router()
    router.learn([("q", "a", "n2")], 0)
    assert router.routes.get(("q", None)) is None and ("q", None) not in router.routes
    assert router.routes.refreshed(("q", None)) is None and router.routes.packed(("q", None)) is None
