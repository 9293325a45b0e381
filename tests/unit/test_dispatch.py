"""Examples of group dispatch in one queue, one rule per test, through the Broker facade.

Messages are named by group and position ("a1" is the first message of group a); consumers are
"c1", "c2", ... Time only moves when a test says so.
"""

from __future__ import annotations

import pytest

from node.core.dispatch.message import Outcome
from node.core.dispatch.queue_dispatch import Dispatcher


# ---- exclusive -----------------------------------------------------------------------------------

def test_exclusive_group_sticks_to_its_first_consumer_for_the_consumers_lifetime(make):
    h = make(group_policy="exclusive")
    h.attach("c1", 10)
    h.attach("c2", 10)
    assert h.send("a", "a1") == [("c1", "a1")]
    h.accept("a1")
    # c1 holds nothing of a now, c2 has more room, yet a stays with c1
    assert h.send("a", "a2") == [("c1", "a2")]
    assert h.send("b", "b1") == [("c2", "b1")]
    h.accept("a2", "b1")
    assert h.send("a", "a3") == [("c1", "a3")]
    assert h.owners() == {"a": "c1", "b": "c2"}


def test_exclusive_owner_holds_up_to_its_credit_of_its_groups_messages(make):
    h = make(group_policy="exclusive")
    for n in range(1, 6):
        h.send("a", f"a{n}")
    h.attach("c1", 3)
    assert h.held_by("c1") == ["a1", "a2", "a3"]
    h.attach("c2", 10)
    assert h.held_by("c2") == []  # a belongs to c1, which has no credit left
    assert h.credit("c1", 2) == [("c1", "a4"), ("c1", "a5")]


def test_exclusive_group_moves_to_another_consumer_when_its_owner_detaches(make):
    h = make(group_policy="exclusive")
    h.attach("c1", 2)
    h.attach("c2", 1)
    h.send("a", "a1")
    h.accept("a1")
    h.send("a", "a2")
    assert h.held_by("c1") == ["a2"]
    assert h.detach("c1") == [("c2", "a2")]
    assert h.owners() == {"a": "c2"}


def test_exclusive_messages_without_group_id_are_spread_over_consumers(make):
    h = make(group_policy="exclusive")
    h.attach("c1", 10)
    h.attach("c2", 10)
    delivered = []
    for n in range(4):
        delivered += h.send(None, f"u{n}")
    assert delivered == [("c1", "u0"), ("c2", "u1"), ("c1", "u2"), ("c2", "u3")]
    assert h.stats()["groups"] == 0


def test_exclusive_messages_without_group_id_join_the_default_group_when_one_is_set(make):
    h = make(group_policy="exclusive", default_group="orphans")
    h.attach("c1", 10)
    h.attach("c2", 10)
    delivered = []
    for n in range(4):
        delivered += h.send(None, f"u{n}")
    assert delivered == [("c1", "u0"), ("c1", "u1"), ("c1", "u2"), ("c1", "u3")]
    assert h.owners() == {"orphans": "c1"}


# ---- shared --------------------------------------------------------------------------------------

def test_shared_owner_takes_the_first_n_messages_of_a_group_where_n_is_its_credit(make):
    h = make(group_policy="shared")
    for n in range(1, 6):
        h.send("a", f"a{n}")
    h.attach("c1", 2)
    h.attach("c2", 10)
    assert h.held_by("c1") == ["a1", "a2"]
    assert h.held_by("c2") == []


def test_shared_group_is_blocked_for_other_consumers_until_every_delivered_message_is_settled(make):
    h = make(group_policy="shared")
    for n in range(1, 5):
        h.send("a", f"a{n}")
    h.attach("c1", 2)
    h.attach("c2", 10)
    assert h.accept("a1") == []  # a2 is still unsettled at c1
    assert h.held_by("c2") == []
    assert h.accept("a2") == [("c2", "a3"), ("c2", "a4")]


def test_shared_group_is_free_for_any_consumer_once_its_owner_settled_everything(make):
    h = make(group_policy="shared")
    h.attach("c1", 10)
    h.attach("c2", 10)
    assert h.send("a", "a1") == [("c1", "a1")]
    h.accept("a1")
    assert h.owners() == {}
    assert h.send("a", "a2") == [("c2", "a2")]  # c2 has been idle longest


def test_shared_messages_without_group_id_share_the_qpid_default_group(make):
    h = make(group_policy="shared")
    h.send(None, "u1")
    h.send(None, "u2")
    h.attach("c1", 1)
    h.attach("c2", 1)
    assert h.held_by("c1") == ["u1"]
    assert h.held_by("c2") == []
    assert h.owners() == {"qpid.no-group": "c1"}


def test_shared_default_group_can_be_renamed_per_queue(make):
    h = make(group_policy="shared", default_group="EMPTY-GROUP")
    h.send(None, "u1")
    assert [row["group"] for row in h.queue.group_rows()] == ["EMPTY-GROUP"]


def test_shared_default_group_can_be_renamed_for_the_whole_broker(make):
    from node.core.dispatch.broker import Broker
    h = make(broker=Broker(default_group="EMPTY-GROUP"), group_policy="shared")
    h.send(None, "u1")
    assert [row["group"] for row in h.queue.group_rows()] == ["EMPTY-GROUP"]


def test_the_broker_wide_default_group_does_not_group_an_exclusive_queue(make):
    from node.core.dispatch.broker import Broker
    h = make(broker=Broker(default_group="EMPTY-GROUP"), group_policy="exclusive")
    h.send(None, "u1")
    assert h.queue.group_rows() == []


# ---- none ----------------------------------------------------------------------------------------

def test_policy_none_lets_consumers_compete_for_the_messages_of_one_group(make):
    h = make(group_policy="none")
    h.attach("c1", 10)
    h.attach("c2", 10)
    assert h.send("a", "a1") + h.send("a", "a2") == [("c1", "a1"), ("c2", "a2")]
    assert h.stats()["groups"] == 0


# ---- closing a group -----------------------------------------------------------------------------

@pytest.mark.parametrize("policy", ["exclusive", "shared"])
def test_a_closing_message_goes_to_the_current_owner(make, policy):
    h = make(group_policy=policy)
    h.attach("c1", 10)
    h.attach("c2", 10)
    h.send("a", "a1")
    assert h.send("a", "a2", closes=True) == [("c1", "a2")]


def test_a_closed_group_is_freed_once_the_close_and_earlier_messages_are_settled(make):
    h = make(group_policy="exclusive")
    h.attach("c1", 10)
    h.attach("c2", 10)
    h.send("b", "b1")  # gives c1 a group, so c2 owns fewer
    h.send("a", "a1")
    h.send("a", "a2", closes=True)
    assert h.held_by("c2") == ["a1", "a2"]
    assert h.send("a", "a3") == []  # waits: the close is still in flight
    assert h.accept("a2") == []  # a1 is still in flight too
    assert h.owners()["a"] == "c2"
    assert h.accept("a1") == [("c2", "a3")]  # the fewest-groups consumer again, as a new owner
    assert h.first_flags() == {"a3": True}


def test_a_close_on_a_message_without_group_closes_nothing(make):
    h = make(group_policy="exclusive")
    h.attach("c1", 10)
    assert h.send(None, "u1", closes=True) == [("c1", "u1")]
    assert h.send(None, "u2") == [("c1", "u2")]


# ---- first for consumer --------------------------------------------------------------------------

def test_the_first_message_to_a_new_owner_is_flagged_and_later_ones_are_not(make):
    h = make(group_policy="exclusive", group_first_key="JMSXGroupFirstForConsumer")
    h.attach("c1", 10)
    h.send("a", "a1")
    assert h.first_flags() == {"a1": True}
    h.send("a", "a2")
    assert h.first_flags() == {"a2": False}
    h.accept("a1", "a2")
    h.send("a", "a3")
    assert h.first_flags() == {"a3": False}  # still the same owner


def test_the_new_owner_after_a_detach_gets_the_flag_on_the_redelivered_message(make):
    h = make(group_policy="exclusive")
    h.attach("c1", 10)
    h.attach("c2", 10)
    h.send("a", "a1")
    h.detach("c1")
    assert h.log[-1] == ("c2", "a1")
    assert h.first_flags() == {"a1": True}


def test_a_redelivery_to_the_same_exclusive_owner_is_not_flagged(make):
    h = make(group_policy="exclusive")
    h.attach("c1", 10)
    h.send("a", "a1")
    assert h.release("a1") == [("c1", "a1")]
    assert h.first_flags() == {"a1": False}


def test_messages_without_group_are_never_flagged_first(make):
    h = make(group_policy="exclusive")
    h.attach("c1", 10)
    h.send(None, "u1")
    assert h.first_flags() == {"u1": False}


def test_shared_owner_is_flagged_again_each_time_it_takes_the_group_anew(make):
    h = make(group_policy="shared")
    h.attach("c1", 10)
    h.send("a", "a1")
    h.send("a", "a2")
    assert h.first_flags() == {"a2": False}
    h.accept("a1", "a2")
    h.send("a", "a3")
    assert h.first_flags() == {"a3": True}


# ---- rebalance -----------------------------------------------------------------------------------

def test_rebalance_frees_every_owner_when_a_consumer_attaches(make):
    h = make(group_policy="exclusive", group_rebalance=True)
    h.attach("c1", 10)
    h.send("a", "a1")
    h.send("b", "b1")
    h.accept("a1", "b1")
    assert h.owners() == {"a": "c1", "b": "c1"}
    h.attach("c2", 10)
    assert h.owners() == {}
    h.send("a", "a2")
    h.send("b", "b2")
    assert h.log[-2:] == [("c2", "a2"), ("c1", "b2")]  # both own none: c2 waited longer


def test_a_browser_attaching_does_not_trigger_a_rebalance(make):
    h = make(group_policy="exclusive", group_rebalance=True)
    h.attach("c1", 10)
    h.send("a", "a1")
    h.attach("b1", browse=True)
    assert h.owners() == {"a": "c1"}


def test_rebalance_with_pause_holds_groups_with_in_flight_messages_until_they_settle(make):
    h = make(group_policy="exclusive", group_rebalance=True, group_rebalance_pause_dispatch=True)
    h.attach("c1", 10)
    h.send("a", "a1")
    h.attach("c2", 10)
    assert h.send("a", "a2") == []  # a1 is still in flight at c1: a waits
    assert h.owners() == {"a": "c1"}
    assert h.accept("a1") == [("c2", "a2")]  # freed; both own none, and c2 waited longer
    assert h.first_flags() == {"a2": True}


def test_rebalance_with_pause_frees_idle_groups_at_once(make):
    h = make(group_policy="exclusive", group_rebalance=True, group_rebalance_pause_dispatch=True)
    h.attach("c1", 10)
    h.send("a", "a1")
    h.accept("a1")
    h.attach("c2", 10)
    assert h.owners() == {}


def test_rebalance_with_pause_releases_a_held_group_when_its_owner_detaches(make):
    h = make(group_policy="shared", group_rebalance=True, group_rebalance_pause_dispatch=True)
    h.attach("c1", 10)
    h.send("a", "a1")
    h.send("a", "a2")
    h.attach("c2", 10)
    assert h.send("a", "a3") == []
    assert h.detach("c1") == [("c2", "a1"), ("c2", "a2"), ("c2", "a3")]


def test_rebalance_without_pause_dispatches_a_reassigned_group_at_once(make):
    # the documented risk of rebalancing without a pause: two consumers hold messages of one group
    h = make(group_policy="exclusive", group_rebalance=True)
    h.attach("c1", 10)
    h.send("a", "a1")
    h.attach("c2", 10)
    assert h.send("a", "a2") == [("c2", "a2")]
    assert h.held_by("c1") == ["a1"]


def test_reset_of_one_group_frees_only_that_group_once_it_settles(make):
    h = make(group_policy="exclusive")
    h.attach("c1", 10)
    h.send("a", "a1")
    h.send("b", "b1")
    h.accept("b1")
    assert h.broker.reset_groups("q", "a", 0)[0] == 1
    assert h.owners() == {"a": "c1", "b": "c1"}  # a1 is in flight: held until settled
    h.accept("a1")
    assert h.owners() == {"b": "c1"}


# ---- buckets -------------------------------------------------------------------------------------

def test_buckets_minus_one_tracks_every_group_apart(make):
    h = make(group_policy="exclusive", group_buckets=-1)
    for n in range(20):
        h.send(f"g{n}")
    assert h.stats()["groups"] == 20


def test_buckets_zero_turns_grouping_off(make):
    h = make(group_policy="exclusive", group_buckets=0)
    h.attach("c1", 10)
    h.attach("c2", 10)
    assert h.send("a", "a1") + h.send("a", "a2") == [("c1", "a1"), ("c2", "a2")]
    assert h.stats()["groups"] == 0


def test_buckets_hash_group_ids_into_that_many_groups(make):
    h = make(group_policy="exclusive", group_buckets=4)
    for n in range(50):
        h.send(f"g{n}")
    rows = h.queue.group_rows()
    assert 1 < len(rows) <= 4
    assert all(row["group"] in {"0", "1", "2", "3"} for row in rows)
    assert sum(row["messages"] for row in rows) == 50


def test_buckets_keep_one_group_id_in_one_bucket_and_order(make):
    h = make(group_policy="shared", group_buckets=3)
    h.attach("c1", 1)
    h.attach("c2", 5)
    for n in range(1, 4):
        h.send("a", f"a{n}")
    assert h.held_by("c1") == ["a1"]
    assert "a2" not in h.held_by("c2")


# ---- holding dispatch ----------------------------------------------------------------------------

def test_dispatch_waits_until_consumers_before_dispatch_are_attached(make):
    h = make(consumers_before_dispatch=2)
    h.send("a", "a1")
    h.send("b", "b1")
    assert h.attach("c1", 10) == []
    # an AMQP consumer grants credit after it attaches: c1 must not take everything meanwhile
    assert h.attach("c2") == []
    assert h.credit("c2", 10) == [("c1", "a1"), ("c2", "b1")]


def test_dispatch_waits_time_before_dispatch_counted_from_the_first_attach(make):
    h = make(time_before_dispatch_ms=100)
    h.send("a", "a1")
    h.now_ms = 50
    assert h.attach("c1", 10) == []
    assert h.broker.next_deadline_ms() == 150
    assert h.tick(149) == []
    assert h.tick(150) == [("c1", "a1")]
    assert h.broker.next_deadline_ms() is None


def test_either_rule_opens_dispatch_when_both_are_set(make):
    h = make(consumers_before_dispatch=3, time_before_dispatch_ms=100)
    h.send("a", "a1")
    h.attach("c1", 10)
    assert h.tick(99) == []
    assert h.tick(100) == [("c1", "a1")]


def test_the_dispatch_delay_applies_again_after_every_consumer_detached(make):
    h = make(time_before_dispatch_ms=100)
    h.attach("c1", 10)
    h.tick(100)
    h.detach("c1")
    h.send("a", "a1")
    h.now_ms = 200
    assert h.attach("c2", 10) == []
    assert h.tick(300) == [("c2", "a1")]


def test_held_dispatch_spreads_groups_over_the_consumers_that_arrived(make):
    h = make(consumers_before_dispatch=2)
    for group in "abcd":
        h.send(group, f"{group}1")
    h.attach("c1", 10)
    h.attach("c2")
    h.credit("c2", 10)
    assert h.owners() == {"a": "c1", "b": "c2", "c": "c1", "d": "c2"}


# ---- choosing an owner ---------------------------------------------------------------------------

def test_a_new_group_goes_to_the_consumer_owning_the_fewest_groups(make):
    h = make(group_policy="exclusive")
    h.attach("c1", 10)
    h.send("a", "a1")
    h.send("b", "b1")
    h.attach("c2", 10)
    h.attach("c3", 10)
    h.send("c", "c1")  # c2 and c3 both own none; c2 waited longest
    h.send("d", "d1")
    h.send("e", "e1")
    assert h.owners() == {"a": "c1", "b": "c1", "c": "c2", "d": "c3", "e": "c2"}


def test_a_new_group_skips_consumers_without_credit(make):
    h = make(group_policy="exclusive")
    h.attach("c1", 10)
    h.send("a", "a1")
    h.attach("c2", 0)
    assert h.send("b", "b1") == [("c1", "b1")]


# ---- dispositions --------------------------------------------------------------------------------

def test_an_accepted_message_is_removed(make):
    h = make()
    h.attach("c1", 10)
    h.send("a", "a1")
    h.accept("a1")
    assert h.stats()["depth_messages"] == 0
    assert h.stats()["acquired_messages"] == 0


def test_a_released_message_returns_to_the_head_of_its_group_in_its_original_place(make):
    h = make(group_policy="shared")
    h.attach("c1", 2)
    for n in range(1, 5):
        h.send("a", f"a{n}")
    h.release("a2")
    h.accept("a1")
    assert h.credit("c1", 2) == [("c1", "a2"), ("c1", "a3")]
    assert h.delivery_counts() == {"a2": 0, "a3": 0}


def test_released_messages_are_redelivered_in_queue_order_when_released_out_of_order(make):
    h = make(group_policy="exclusive")
    h.attach("c1", 3)
    for n in range(1, 5):
        h.send("a", f"a{n}")
    h.credit("c1", 0)
    h.release("a3")
    h.release("a1")
    h.release("a2")
    assert h.credit("c1", 10) == [("c1", "a1"), ("c1", "a2"), ("c1", "a3"), ("c1", "a4")]


def test_modified_with_delivery_failed_counts_a_failed_delivery(make):
    h = make()
    h.attach("c1", 10)
    h.send("a", "a1")
    assert h.modify("a1", delivery_failed=True) == [("c1", "a1")]
    assert h.delivery_counts() == {"a1": 1}


def test_modified_without_delivery_failed_counts_nothing(make):
    h = make()
    h.attach("c1", 10)
    h.send("a", "a1")
    h.modify("a1", delivery_failed=False)
    assert h.delivery_counts() == {"a1": 0}


def test_a_rejected_message_is_removed_and_the_group_moves_on(make):
    h = make(group_policy="shared")
    h.attach("c1", 1)
    h.attach("c2", 1)
    h.send("a", "a1")
    h.send("a", "a2")
    assert h.reject("a1") == [("c2", "a2")]
    assert h.stats()["depth_messages"] == 1


def test_a_late_or_duplicate_disposition_changes_nothing(make):
    h = make()
    h.attach("c1", 10)
    h.send("a", "a1")
    consumer, delivery_id = h.unsettled["a1"]
    h.accept("a1")
    assert h.broker.settle(consumer, delivery_id, Outcome.RELEASED, 0) == []
    assert h.stats()["depth_messages"] == 0


def test_detach_releases_unsettled_messages_in_order_with_their_delivery_count_incremented(make):
    h = make(group_policy="exclusive")
    h.attach("c1", 10)
    for n in range(1, 4):
        h.send("a", f"a{n}")
    h.accept("a1")
    h.attach("c2", 10)
    assert h.detach("c1") == [("c2", "a2"), ("c2", "a3")]
    assert h.delivery_counts() == {"a2": 1, "a3": 1}


def test_detach_redelivers_before_later_messages_of_the_group_to_the_next_owner(make):
    h = make(group_policy="shared")
    h.attach("c1", 2)
    for n in range(1, 5):
        h.send("a", f"a{n}")
    h.attach("c2", 0)
    h.detach("c1")
    assert h.credit("c2", 10) == [("c2", "a1"), ("c2", "a2"), ("c2", "a3"), ("c2", "a4")]


def test_delivery_count_max_dead_letters_a_message_after_that_many_failed_deliveries(make):
    h = make(delivery_count_max=2)
    h.attach("c1", 10)
    h.send("a", "a1")
    h.send("a", "a2")
    assert h.modify("a1") == [("c1", "a1")]
    assert h.delivery_counts() == {"a1": 1}
    assert h.modify("a1") == []
    assert h.dropped() == []
    assert h.stats()["depth_messages"] == 1
    assert h.broker.queues["q.DLQ"].stats()["depth_messages"] == 1


# ---- blocked groups ------------------------------------------------------------------------------

def test_a_blocked_group_never_blocks_another_group(make):
    h = make(group_policy="exclusive")
    h.attach("c1", 1)
    h.send("a", "a1")  # c1 has no credit left: a is blocked
    h.send("a", "a2")
    h.attach("c2", 10)
    assert h.send("b", "b1") == [("c2", "b1")]


@pytest.mark.parametrize("policy", ["exclusive", "shared"])
def test_a_deep_blocked_group_costs_nothing_to_skip(make, policy, monkeypatch):
    h = make(group_policy=policy, durable=False)
    h.attach("c1", 1)
    h.send("a", "a0")  # c1 owns a and has no credit left
    for n in range(1, 100_000):
        h.send("a", f"a{n}")
    h.attach("c2", 1)  # 100k messages of a wait ahead of one of b
    peeks = []
    original = Dispatcher._peek

    def counting_peek(self, *args):
        peeks.append(1)
        return original(self, *args)

    monkeypatch.setattr(Dispatcher, "_peek", counting_peek)
    assert h.send("b", "b1") == [("c2", "b1")]
    assert len(peeks) <= 4
    assert h.stats()["depth_messages"] == 100_001


# ---- browsers ------------------------------------------------------------------------------------

def test_browsers_see_available_messages_regardless_of_ownership(make):
    h = make(group_policy="exclusive")
    h.attach("c1", 0)
    h.send("a", "a1")
    h.send("b", "b1")
    h.credit("c1", 1)  # c1 owns a, holds a1; b1 is available
    assert h.attach("v", 10, browse=True) == [("v", "b1")]
    assert h.send("a", "a2") == [("v", "a2")]  # c1 has no credit; the browser still sees it


def test_browsers_never_acquire(make):
    h = make()
    h.attach("v", 10, browse=True)
    h.send("a", "a1")
    assert h.log == [("v", "a1")]
    assert h.stats()["acquired_messages"] == 0
    assert h.attach("c1", 10) == [("c1", "a1")]
    assert h.owners() == {"a": "c1"}


def test_browsers_skip_expired_messages_and_never_see_a_message_twice(make):
    h = make()
    h.send("a", "a1", ttl_ms=10)
    h.send("a", "a2")
    h.now_ms = 10
    assert h.attach("v", 1, browse=True) == [("v", "a2")]
    assert h.credit("v", 5) == []


def test_browsers_need_credit_like_any_consumer(make):
    h = make()
    h.send("a", "a1")
    h.send("a", "a2")
    assert h.attach("v", 1, browse=True) == [("v", "a1")]
    assert h.credit("v", 1) == [("v", "a2")]


def test_a_browser_settling_a_copy_changes_nothing(make):
    h = make()
    h.send("a", "a1")
    h.attach("v", 1, browse=True)
    assert h.broker.settle("v", 0, Outcome.ACCEPTED, 0) == []
    assert h.stats()["depth_messages"] == 1


# ---- time to live --------------------------------------------------------------------------------

def test_an_expired_message_is_dropped_on_tick_where_it_stands(make):
    h = make()
    h.attach("c1", 0)
    h.send("a", "a1")
    h.send("a", "a2", ttl_ms=10)
    h.send("a", "a3")
    h.tick(10)
    assert [reason for _, _, reason in h.dropped()] == ["ttl expired"]
    assert h.stats()["depth_messages"] == 2
    assert h.credit("c1", 10) == [("c1", "a1"), ("c1", "a3")]


def test_an_expired_message_never_blocks_its_group(make):
    h = make(group_policy="shared")
    h.attach("c1", 1)
    h.send("a", "a1")
    h.send("a", "a2", ttl_ms=10)
    h.send("a", "a3")
    h.attach("c2", 5)
    h.now_ms = 20  # no tick yet: a2 is found expired when it reaches the head
    assert h.accept("a1") == [("c2", "a3")]
    assert [reason for _, _, reason in h.dropped()] == ["ttl expired"]


def test_an_expired_message_at_the_head_of_an_unowned_group_is_dropped_at_dispatch(make):
    h = make()
    h.send("a", "a1", ttl_ms=10)
    h.now_ms = 20
    assert h.attach("c1", 1) == []
    assert [reason for _, _, reason in h.dropped()] == ["ttl expired"]
    assert h.stats()["groups"] == 0
    assert h.send("a", "a2") == [("c1", "a2")]


def test_an_expired_message_without_group_is_dropped_at_dispatch(make):
    h = make(group_policy="none")
    h.send(None, "u1", ttl_ms=10)
    h.send(None, "u2")
    h.now_ms = 20
    assert h.attach("c1", 1) == [("c1", "u2")]


def test_a_message_that_expired_while_acquired_is_dropped_as_soon_as_it_comes_back(make):
    h = make(depth_max_messages=2)
    h.attach("c1", 1)
    h.send("a", "a1", ttl_ms=10)
    h.send("a", "a2")
    h.tick(20)  # a1 is acquired: an expiry never takes a message from its consumer
    assert h.dropped() == []
    assert h.release("a1") == []  # c1 has no credit: a1 must not wait in its group meanwhile
    assert [reason for _, _, reason in h.dropped()] == ["ttl expired"]
    assert h.stats()["depth_messages"] == 1
    h.send("b", "b1")  # the room a1 took is free again
    assert h.credit("c1", 1) == [("c1", "a2")]


def test_a_message_that_expired_while_acquired_is_dropped_when_its_consumer_detaches(make):
    h = make()
    h.attach("c1", 1)
    h.send("a", "a1", ttl_ms=10)
    h.tick(20)
    h.detach("c1")
    assert [reason for _, _, reason in h.dropped()] == ["ttl expired"]
    assert h.stats()["depth_messages"] == 0
    assert h.stats()["groups"] == 0


def test_next_deadline_is_the_earliest_expiry(make):
    h = make()
    h.send("a", "a1", ttl_ms=30)
    h.send("a", "a2", ttl_ms=10)
    assert h.broker.next_deadline_ms() == 10
