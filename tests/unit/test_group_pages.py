"""node.admin.group_pages over a real core Broker: pages are bounded, cover every group once when
nothing changes between them, find an exact id at once, and name a consumer's groups."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from node.admin.group_pages import PAGE_SIZE_MAX, group_page
from node.core.dispatch.broker import Broker
from node.core.errors import InvalidField
from node.core.dispatch.message import Message
from node.core.dispatch.settings import QueueSettings


def broker_with(groups: list[str], now_ms: int = 1000) -> Broker:
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q"))
    for group in groups:
        broker.enqueue("q", Message(b"x", group), now_ms)
    return broker


def all_pages(queue, prefix: str, page_size: int, scanned_max: int) -> list[str]:
    seen, position = [], 0
    while True:
        page = group_page(queue, prefix, position, page_size, 2000, scanned_max=scanned_max)
        exact = 1 if position == 0 and prefix in queue.groups else 0
        assert len(page["groups"]) <= page_size + exact and page["scanned"] <= scanned_max
        seen.extend(row["group"] for row in page["groups"])
        if page["next_position"] >= page["groups_total"]:
            return seen
        assert page["next_position"] > position, "a page that moves nowhere would be asked for ever"
        position = page["next_position"]


@settings(max_examples=60, deadline=None)
@given(groups=st.lists(st.text("abc", min_size=1, max_size=3), unique=True, max_size=40),
       prefix=st.text("abc", max_size=2), page_size=st.integers(1, 7), scanned_max=st.integers(1, 9))
def test_pages_list_each_matching_group_once(groups, prefix, page_size, scanned_max):
    queue = broker_with(groups).queue("q")
    seen = all_pages(queue, prefix, page_size, scanned_max)
    expected = [group for group in groups if group.startswith(prefix)]
    assert sorted(seen) == sorted(expected)
    assert len(seen) == len(set(seen))


def test_an_exact_id_comes_first_without_scanning_to_it():
    queue = broker_with([f"g{i}" for i in range(1000)]).queue("q")
    page = group_page(queue, "g999", 0, 5, 2000, scanned_max=10)
    assert page["groups"][0]["group"] == "g999"
    assert page["scanned"] == 10 and page["next_position"] == 10


def test_a_row_has_owner_depth_and_head_age():
    broker = broker_with(["a", "a", "b"], now_ms=1000)
    broker.attach_consumer("q", 7, False, 1000)
    broker.set_credit(7, 1, 1000)
    page = group_page(broker.queue("q"), "", 0, 10, 1500, label_of=lambda consumer_id: f"client/{consumer_id}",
                      client_of=lambda consumer_id: "10.1.2.3:50001 (app)")
    rows = {row["group"]: row for row in page["groups"]}
    assert rows["a"] == {"group": "a", "messages": 2, "acquired": 1, "consumer": "7", "head_age_ms": 500}
    assert rows["b"]["consumer"] is None and rows["b"]["head_age_ms"] == 500
    assert page["consumers"] == [{"consumer": "7", "label": "client/7", "groups_owned": 1, "groups": ["a"],
                                  "unsettled": 1, "credit": 0, "client": "10.1.2.3:50001 (app)"}]


@pytest.mark.parametrize("arguments, field", [(("", 0, 0), "page_size"), (("", 0, PAGE_SIZE_MAX + 1), "page_size"),
                                              (("", -1, 5), "position"), (("x" * 2000, 0, 5), "prefix")])
def test_a_bad_request_names_its_field(arguments, field):
    with pytest.raises(InvalidField, match=field):
        group_page(broker_with([]).queue("q"), *arguments, 0)
