"""Consumer-chosen groups by the Service Bus session filter (issue 30): `com.microsoft:session-filter` naming
a group is the selector `JMSXGroupID = 'X'`; null asks for the next free group (Queue.next_free_group); the
node answers the filter with the group the consumer got, as the client named the filter."""

from __future__ import annotations

import pytest
from proton import Data, Described, symbol, ulong

from node.amqp.source_filters import (SELECTOR_FILTER, SESSION_FILTER, SESSION_FILTER_CODE, applied_selector, echo,
                                      resolve_next_free)
from node.core.dispatch.selector import InvalidSelector, compile_selector
from node.core.dispatch.selector_dispatch import MessageSelector
from node.core.errors import NotFound

KEPT: list = []  # proton frees a Data's pn_data_t with the object


def filter_set(entries: dict) -> Data:
    data = Data()
    data.put_object(entries)
    KEPT.append(data)
    return data


def answer_of(applied) -> dict:
    answer = Data()
    KEPT.append(answer)
    echo(answer._data, applied)
    answer.rewind()
    return answer.get_object() if answer.next() is not None else {}


@pytest.mark.parametrize("value", [Described(ulong(SESSION_FILTER_CODE), "order-7"),
                                   Described(symbol(SESSION_FILTER), "order-7"), "order-7"])
def test_a_session_filter_naming_a_group_chooses_it_and_is_answered_as_the_client_wrote_it(value):
    entries = {symbol(SESSION_FILTER): value}
    applied = applied_selector(filter_set(entries)._data)
    assert applied.selector.group_id == "order-7" and not applied.next_free
    assert answer_of(applied) == entries


def test_a_group_id_with_a_quote_is_chosen_whole():
    applied = applied_selector(filter_set({symbol(SESSION_FILTER): "it's"})._data)
    assert applied.selector.group_id == "it's"


def test_a_session_filter_wins_over_a_selector_of_the_same_attach_which_is_then_not_echoed():
    entries = {symbol("selector"): Described(symbol(SELECTOR_FILTER), "n > 1"),
               symbol(SESSION_FILTER): Described(ulong(SESSION_FILTER_CODE), "g")}
    assert answer_of(applied_selector(filter_set(entries)._data)) == {
        symbol(SESSION_FILTER): Described(ulong(SESSION_FILTER_CODE), "g")}


@pytest.mark.parametrize("value", [Described(ulong(SESSION_FILTER_CODE), 42), ""])
def test_a_session_filter_holding_neither_a_group_id_nor_null_is_refused_saying_so(value):
    with pytest.raises(InvalidSelector, match="group id .* or null for the next free group"):
        applied_selector(filter_set({symbol(SESSION_FILTER): value})._data)


def test_a_null_session_filter_gets_the_group_whose_head_is_oldest_among_the_free_ones(make):
    h = make(durable=False)
    h.attach("busy", 10)
    h.send("held", "held1")  # taken by busy: it has a consumer
    h.credit("busy", 0)
    h.send("b", "b1")
    h.send("a", "a1")
    h.send("held", "held2")
    applied = applied_selector(filter_set({symbol(SESSION_FILTER): Described(ulong(SESSION_FILTER_CODE), None)})._data)
    assert applied.next_free
    got = resolve_next_free(applied, h.queue)
    assert got.selector.group_id == "b" and answer_of(got) == {
        symbol(SESSION_FILTER): Described(ulong(SESSION_FILTER_CODE), "b")}
    # once a consumer chose b, the next asker gets a; then none is left
    h.broker.attach_consumer("q", "chooser", False, h.now_ms, selector=MessageSelector(got.selector, None))
    assert h.queue.next_free_group() == "a"
    h.broker.attach_consumer("q", "chooser2", False, h.now_ms,
                             selector=MessageSelector(compile_selector("JMSXGroupID = 'a'"), None))
    assert h.queue.next_free_group() is None
    with pytest.raises(NotFound, match="no group with a message waiting and no consumer.*attach again later"):
        resolve_next_free(applied, h.queue)
