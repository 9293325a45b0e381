"""A consumer's source filters at attach (node/amqp/source_filters.py): the JMS selector is found by its
symbol or its code, compiled, refused with its position when malformed, and echoed alone, as the
client named it; other filters are never echoed."""

from __future__ import annotations

import pytest
from proton import Data, Described, symbol, ulong

from node.amqp.source_filters import SELECTOR_FILTER, SELECTOR_FILTER_CODE, applied_selector, echo
from node.core.dispatch.selector import InvalidSelector
from node.core.errors import InvalidField


KEPT: list = []  # the Data objects made here: proton frees a Data's pn_data_t with the object


def filter_set(entries: dict) -> Data:
    data = Data()
    data.put_object(entries)
    KEPT.append(data)
    return data


def read_back(data: Data) -> dict:
    data.rewind()
    return data.get_object() if data.next() is not None else {}


def test_a_selector_named_by_its_symbol_is_compiled():
    applied = applied_selector(filter_set({symbol("selector"): Described(symbol(SELECTOR_FILTER), "a = 1")})._data)
    assert (applied.key, applied.descriptor, applied.selector.text) == ("selector", SELECTOR_FILTER, "a = 1")
    assert applied.selector.matches({"a": 1}) and not applied.selector.matches({"a": 2})


def test_a_selector_named_by_its_code_is_compiled_and_echoed_with_the_code():
    entries = {symbol("jms-selector"): Described(ulong(SELECTOR_FILTER_CODE), "colour = 'green'")}
    applied = applied_selector(filter_set(entries)._data)
    assert applied.descriptor == SELECTOR_FILTER_CODE
    answer = Data()
    echo(answer._data, applied)
    assert read_back(answer) == entries


def test_only_the_selector_is_echoed_of_several_filters():
    entries = {symbol("x-opt-custom"): "anything",
               symbol("other"): Described(symbol("apache.org:legacy-amqp-direct-binding:string"), "key"),
               symbol("selector"): Described(symbol(SELECTOR_FILTER), "n > 1")}
    answer = Data()
    echo(answer._data, applied_selector(filter_set(entries)._data))
    assert read_back(answer) == {symbol("selector"): Described(symbol(SELECTOR_FILTER), "n > 1")}


def test_no_selector_and_an_empty_selector_echo_nothing():
    for entries in ({symbol("x-opt-custom"): "anything"},
                    {symbol("selector"): Described(symbol(SELECTOR_FILTER), "  ")}):
        applied = applied_selector(filter_set(entries)._data)
        assert applied is None
        answer = filter_set(entries)  # the copy of the client's source, before the node answers
        echo(answer._data, applied)
        assert read_back(answer) == {}


def test_a_malformed_selector_is_refused_with_an_invalid_field_naming_the_position():
    with pytest.raises(InvalidSelector) as refused:
        applied_selector(filter_set({symbol("selector"): Described(symbol(SELECTOR_FILTER), "a <")})._data)
    assert isinstance(refused.value, InvalidField)
    assert str(refused.value) == "selector: at 3, expected a value after '<', got end of text"


def test_a_selector_filter_that_holds_no_string_is_refused():
    with pytest.raises(InvalidSelector, match="must hold a string"):
        applied_selector(filter_set({symbol("selector"): Described(symbol(SELECTOR_FILTER), 7)})._data)
