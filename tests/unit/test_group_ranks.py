"""node.admin.group_ranks over a real core Broker: the top groups by backlog, head age and owner are
those a full sort would give, whatever the batch size, and a ranking refuses what it cannot answer."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from node.admin.group_ranks import GROUPS_PER_BATCH, RANK_DEPTH_MAX, rank
from node.core.dispatch.broker import Broker
from node.core.dispatch.message import Message
from node.core.dispatch.settings import QueueSettings
from node.core.errors import InvalidField

GROUPS = 200_000  # enough for several batches; a million is timed in the report, not in the unit suite


def broker_with(arrivals: list[tuple[str, int]]) -> Broker:
    """`arrivals`: (group, arrival time in ms), in order."""
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q"))
    for group, now_ms in arrivals:
        broker.enqueue("q", Message(b"x", group), now_ms)
    return broker


def ranked(broker, order: str, position: int, page_size: int, batch_max: int, prefix: str = "") -> list[str]:
    page = rank(lambda: broker.queue("q"), order, prefix, position, page_size, lambda: 10_000,
                batch_max=batch_max)
    return [row["group"] for row in page["groups"]]


arrivals_strategy = st.lists(st.tuples(st.text("abcd", min_size=1, max_size=2), st.integers(1, 50)), max_size=60)


@settings(max_examples=80, deadline=None)
@given(arrivals=arrivals_strategy, position=st.integers(0, 5), page_size=st.integers(1, 8),
       batch_max=st.integers(1, 9), prefix=st.sampled_from(["", "a", "b"]))
def test_the_top_by_backlog_is_a_full_sort_s_top_whatever_the_batch(arrivals, position, page_size, batch_max, prefix):
    broker = broker_with(arrivals)
    counts: dict[str, int] = {}  # in arrival order, which breaks ties
    for group, _ in arrivals:
        counts[group] = counts.get(group, 0) + 1
    expected = sorted((group for group in counts if group.startswith(prefix)), key=lambda g: -counts[g])
    assert ranked(broker, "backlog", position, page_size, batch_max, prefix) == expected[position:position + page_size]


@settings(max_examples=60, deadline=None)
@given(arrivals=arrivals_strategy, page_size=st.integers(1, 8), batch_max=st.integers(1, 9))
def test_the_top_by_head_age_puts_the_oldest_waiting_message_first(arrivals, page_size, batch_max):
    arrivals = sorted(arrivals, key=lambda arrival: arrival[1])  # time moves forward
    broker = broker_with(arrivals)
    first_seen: dict[str, int] = {}
    for group, now_ms in arrivals:
        first_seen.setdefault(group, now_ms)
    expected = sorted(first_seen, key=lambda g: first_seen[g])  # ties: arrival order
    assert ranked(broker, "head_age", 0, page_size, batch_max) == expected[:page_size]


def test_the_top_by_owner_lists_owned_groups_by_owner_and_leaves_the_rest_out():
    broker = broker_with([("g1", 1), ("g2", 1), ("g3", 1), ("g4", 1)])
    broker.attach_consumer("q", 9, False, 1)
    broker.set_credit(9, 1, 1)  # owns g1
    broker.attach_consumer("q", 8, False, 1)
    broker.set_credit(8, 2, 1)  # owns g2 and g3
    owners = {row["group"]: row["consumer"] for row in rank(lambda: broker.queue("q"), "owner", "", 0, 10,
                                                              lambda: 5, batch_max=2)["groups"]}
    assert list(owners.items()) == [("g2", "8"), ("g3", "8"), ("g1", "9")]


def test_a_ranking_reaches_only_the_first_ranks_and_known_orders():
    broker = broker_with([("g", 1)])
    with pytest.raises(InvalidField, match="order: expected one of backlog, head_age, owner"):
        ranked(broker, "rate", 0, 10, 10)
    with pytest.raises(InvalidField, match=f"the first {RANK_DEPTH_MAX} groups"):
        ranked(broker, "backlog", RANK_DEPTH_MAX, 1, 10)


def test_many_groups_are_ranked_in_bounded_batches_and_a_page_holds_only_its_rows():
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q"))
    queue = broker.queue("q")
    for index in range(GROUPS):
        broker.enqueue("q", Message(b"x", f"g{index}"), 1)
    for _ in range(3):
        broker.enqueue("q", Message(b"x", "g123456"), 2)
    batches = []

    def run(fn):
        batches.append(fn)
        return fn()
    page = rank(lambda: queue, "backlog", "", 0, 20, lambda: 3, run=run)
    assert page["groups"][0] == {"group": "g123456", "messages": 4, "acquired": 0, "consumer": None,
                                 "head_age_ms": 2}
    assert len(page["groups"]) == 20 and page["groups_total"] == GROUPS
    assert len(batches) == GROUPS // GROUPS_PER_BATCH + 1  # each batch a loop turn of its own, then the page
