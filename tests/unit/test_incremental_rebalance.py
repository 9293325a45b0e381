"""Incremental rebalance (issue 30, node/core/dispatch/queue_rebalance.py): examples, and hypothesis against a
reference model of the fewest moves that make the consumers' group counts even within one."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.core.dispatch.queue_lanes import PAUSED
from node.core.dispatch.queue_rebalance import even_targets
from node.core.dispatch.settings import QueueSettings
from node.core.errors import InvalidConfig


def counts(h) -> dict:
    return {cid: c.assigned_count for cid, c in h.queue.consumers.items() if not c.browse}


def spread(h, consumers: int, groups: int) -> None:
    """`groups` groups of one settled message each, spread evenly over consumers c0.. (dispatch gives a
    new group to the taker with the fewest groups)."""
    for index in range(consumers):
        h.attach(f"c{index}", groups)
    for group in range(groups):
        h.send(f"g{group}", f"g{group}-0")
    h.accept(*list(h.unsettled))


def one_holder_per_group(h) -> None:
    """No group has unsettled messages at two consumers at once (what a rebalance's pause keeps)."""
    holders: dict = {}
    for name, (consumer, _) in h.unsettled.items():
        assert holders.setdefault(name.rsplit("-", 1)[0], consumer) == consumer, name


def join(h, consumer: str, credit: int, mode: str) -> int:
    """Switch the queue's rebalance on, attach `consumer`; returns how many groups changed consumer."""
    h.queue.settings = QueueSettings(name="q", group_rebalance=True, group_rebalance_mode=mode,
                                     group_rebalance_pause_dispatch=True, durable=False)
    before = h.owners()
    h.attach(consumer, credit)
    after = h.owners()
    return sum(1 for group, owner in before.items() if after.get(group) != owner)


def test_ten_thousand_groups_over_ten_consumers_an_eleventh_joining_moves_909_groups(make):
    h = make(durable=False)
    spread(h, 10, 10_000)
    assert set(counts(h).values()) == {1000}
    moved = join(h, "c10", 10, "incremental")
    assert moved == 909  # the target is at most 1,000; a reset moves all 10,000 (next test)
    assert sorted(counts(h).values()) == [909] * 10 + [910]


def test_the_same_join_with_reset_moves_every_group(make):
    h = make(durable=False)
    spread(h, 10, 10_000)
    assert join(h, "c10", 10, "reset") == 10_000


def test_a_moved_groups_next_message_goes_to_the_newcomer_flagged_first_and_the_others_stay(make):
    h = make(durable=False)
    spread(h, 2, 6)
    before = h.owners()
    join(h, "c2", 10, "incremental")
    after = h.owners()
    moved = {group for group in before if after[group] != before[group]}
    assert len(moved) == 2 and {after[group] for group in moved} == {"c2"}
    for group in sorted(before):
        h.send(group, f"{group}-1")
    for group in sorted(before):
        assert (after[group], f"{group}-1") in h.log
    h.accept(*list(h.unsettled))
    for group in sorted(moved):
        h.send(group, f"{group}-2")
        assert h.first_flags() == {f"{group}-2": False}  # flagged once, on the first message only


def test_the_first_message_of_a_moved_group_is_flagged_first_for_its_new_consumer(make):
    h = make(durable=False)
    spread(h, 1, 2)
    join(h, "c1", 10, "incremental")
    moved = [group for group, owner in h.owners().items() if owner == "c1"]
    assert len(moved) == 1
    h.send(moved[0], "next")
    assert h.first_flags() == {"next": True}


def test_a_group_in_flight_moves_only_once_settled_and_no_other_group_pauses(make):
    h = make(durable=False)
    h.attach("c0", 10)
    h.send("a", "a0")  # a stays in flight
    h.send("b", "b0")
    h.accept("b0")
    join(h, "c1", 10, "incremental")
    # c0 holds 2: one moves, and b (settled) is preferred over a (in flight)
    assert h.owners() == {"a": "c0", "b": "c1"}
    assert not h.queue.groups["a"].paused and not h.queue.groups["b"].paused
    h.send("c", "c0")
    h.send("d", "d0")
    h.accept("c0", "d0")
    assert counts(h) == {"c0": 2, "c1": 2}


def test_when_only_groups_in_flight_can_move_they_pause_and_go_to_the_newcomer_once_settled(make):
    h = make(durable=False)
    h.attach("c0", 10)
    h.send("a", "a0")
    h.send("b", "b0")
    join(h, "c1", 10, "incremental")
    paused = [key for key, group in h.queue.groups.items() if group.placed is PAUSED]
    assert len(paused) == 1
    group = paused[0]
    assert h.send(group, f"{group}1") == []  # it waits: its first message is in flight at c0
    assert h.accept(f"{group}0") == [("c1", f"{group}1")]
    assert h.first_flags() == {f"{group}1": True}


def test_group_rebalance_is_spelled_reset_or_incremental_in_a_config_table():
    settings = QueueSettings.from_dict({"name": "q", "group_rebalance": "incremental"})
    assert settings.group_rebalance and settings.group_rebalance_mode == "incremental"
    assert QueueSettings.from_dict({"name": "q", "group-rebalance": "reset"}).group_rebalance_mode == "reset"
    assert QueueSettings.from_dict({"name": "q", "group_rebalance": True}).group_rebalance_mode == "reset"
    with pytest.raises(InvalidConfig, match="group_rebalance_mode.*'sometimes' is not one of reset, incremental"):
        QueueSettings.from_dict({"name": "q", "group_rebalance": "sometimes"})
    with pytest.raises(InvalidConfig, match="needs group_rebalance"):
        QueueSettings(name="q", group_rebalance_mode="incremental").validate()
    assert "group_rebalance_mode" not in QueueSettings(name="q").to_dict()  # records stay as they were
    assert QueueSettings(name="q", group_rebalance=True, group_rebalance_mode="incremental").to_dict()[
        "group_rebalance_mode"] == "incremental"


# ---- the reference model -------------------------------------------------------------------------------

def fewest_moves(loads: list[int]) -> int:
    """Brute force over who ends at ceil: the fewest groups that must leave their consumer to make the
    counts even within one (a group moves only if its consumer ends below what it holds)."""
    base, extra = divmod(sum(loads), len(loads))
    best = None
    for ceil_members in itertools.combinations(range(len(loads)), extra):
        moves = sum(max(0, load - base - (index in ceil_members)) for index, load in enumerate(loads))
        best = moves if best is None else min(best, moves)
    return best


@given(st.lists(st.integers(0, 30), min_size=1, max_size=7))
def test_even_targets_are_even_within_one_sum_to_the_total_and_move_the_fewest(loads):
    targets = even_targets(list(enumerate(loads)))
    assert sum(targets.values()) == sum(loads)
    assert max(targets.values()) - min(targets.values()) <= 1
    assert sum(max(0, load - targets[index]) for index, load in enumerate(loads)) == fewest_moves(loads)


layouts = st.lists(  # per consumer: its groups, each (messages in flight 0..2, messages queued behind 0..2)
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2)), max_size=8), min_size=1, max_size=5)


@settings(max_examples=150, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(layouts)
def test_a_join_moves_the_fewest_groups_pauses_no_other_and_keeps_every_groups_order(make, layout):
    h = make(durable=False)
    names = itertools.count()
    sent: dict[str, list[str]] = {}
    for index, groups in enumerate(layout):
        consumer = f"c{index}"
        h.attach(consumer, 1000)
        for other in range(index):
            h.credit(f"c{other}", 0)
        for number, (in_flight, _) in enumerate(groups):
            group = f"{consumer}g{number}"
            for _ in range(max(1, in_flight)):
                sent.setdefault(group, []).append(name := f"{group}-{next(names)}")
                h.send(group, name)
            if not in_flight:
                h.accept(*sent[group])
        h.credit(consumer, 0)
        for number, (_, queued) in enumerate(groups):
            group = f"{consumer}g{number}"
            for _ in range(queued):
                sent[group].append(name := f"{group}-{next(names)}")
                h.send(group, name)
    loads = [len(groups) for groups in layout]
    assert [counts(h)[f"c{index}"] for index in range(len(layout))] == loads
    acquired_before = {key: group.acquired for key, group in h.queue.groups.items()}
    before = h.owners()
    join(h, "new", 0, "incremental")  # no credit yet: the join happens at the first credit
    h.credit("new", 1)
    after = h.owners()
    changed = {g for g in before if after.get(g) != before[g]}
    paused = {key for key, group in h.queue.groups.items() if group.placed is PAUSED}
    assert len(changed) + len(paused) == fewest_moves(loads + [0])
    assert not changed & paused
    assert all(acquired_before[g] for g in paused)  # only groups in flight pause: the settled ones move first
    for group in paused:  # a donor pauses a group in flight only once it has no settled group left to give
        kept = [g for g in before if before[g] == before[group] and g not in changed | paused]
        assert all(acquired_before[g] for g in kept), (group, kept)
    gained = {after[g] for g in changed}
    assert not gained & {before[g] for g in changed | paused}  # a consumer gives or takes, never both
    if changed and not paused:  # (paused groups may have filled the newcomer's share)
        assert "new" in gained
    # then everyone takes and settles everything: each group's messages arrive once, in order,
    # and the counts end even within one (the paused groups went to the taker with the fewest groups)
    for index in range(len(layout)):
        h.credit(f"c{index}", 1000)
    h.credit("new", 1000)
    one_holder_per_group(h)
    while h.unsettled:
        for name in sorted(h.unsettled, key=lambda name: int(name.rsplit("-", 1)[1])):
            h.accept(name)
            one_holder_per_group(h)
    delivered: dict[str, list[str]] = {}
    for _, name in h.log:
        delivered.setdefault(name.rsplit("-", 1)[0], []).append(name)
    assert delivered == sent
    final = counts(h)
    kept = [final[f"c{index}"] for index in range(len(layout))] + [final["new"]]
    if all(len(sent[g]) > acquired_before[g] for g in paused):  # a paused group with nothing queued is
        assert max(kept) - min(kept) <= 1, (loads, kept)        # forgotten once settled: nobody takes it


def test_consumers_with_a_selector_neither_give_nor_take_groups():
    import json

    from node.core.dispatch.broker import Broker
    from node.core.dispatch.message import Message
    from node.core.dispatch.selector import compile_selector
    from node.core.dispatch.selector_dispatch import MessageSelector

    broker = Broker()
    queue = broker.declare_queue(QueueSettings(name="q", durable=False))
    broker.attach_consumer("q", "picky", False, 0, selector=MessageSelector(compile_selector("n >= 0"), json.loads))
    broker.set_credit("picky", 100, 0)
    for number in range(6):
        broker.enqueue("q", Message(json.dumps({"n": number}).encode(), f"g{number}"), 0)
    assert queue.consumers["picky"].assigned_count == 6
    queue.settings = QueueSettings(name="q", group_rebalance=True, group_rebalance_mode="incremental", durable=False)
    broker.attach_consumer("q", "plain", False, 0)
    broker.set_credit("plain", 10, 0)  # joins: picky gives nothing
    broker.attach_consumer("q", "picky2", False, 0, selector=MessageSelector(compile_selector("n >= 0"), json.loads))
    broker.set_credit("picky2", 10, 0)  # joins with a selector: takes nothing
    assert {cid: c.assigned_count for cid, c in queue.consumers.items()} == {"picky": 6, "plain": 0, "picky2": 0}
