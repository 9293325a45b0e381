"""Address settings: the word matcher against a regex reference, the specificity order, merging, the
config file's errors, and attach-address parameters."""

import re

import pytest
from hypothesis import given, settings, strategies as st

from node.config import load
from node.core.dispatch.address_settings import (AddressSettings, most_specific_first, parse_table, split_address,
                                        check_parameters)
from node.core.dispatch.broker import Broker
from node.core.errors import AlreadyExists, InvalidConfig, InvalidField, NotFound
from node.core.dispatch.settings import QueueSettings

WORDS = st.sampled_from(["a", "b", "c"])
PATTERN_WORDS = st.sampled_from(["a", "b", "c", "*", "#"])
names = st.lists(WORDS, min_size=1, max_size=5).map(".".join)
patterns = st.lists(PATTERN_WORDS, min_size=1, max_size=5).map(".".join)


def reference_matches(pattern: str, name: str) -> bool:
    """The Artemis grammar as a regex over '.'+name: each word of the pattern eats its leading dot."""
    parts = []
    for word in pattern.split("."):
        parts.append(r"(\.[^.]+)*" if word == "#" else r"\.[^.]+" if word == "*" else re.escape("." + word))
    return re.fullmatch("".join(parts), "." + name) is not None


def tables(*matches_and_values):
    return AddressSettings([parse_table({"match": match, **values}, index)
                            for index, (match, values) in enumerate(matches_and_values)])


@settings(max_examples=400, deadline=None)
@given(st.lists(patterns, min_size=1, max_size=6, unique=True), names)
def test_matching_agrees_with_a_regex_reference_and_lists_the_most_specific_first(matches, name):
    address_settings = tables(*[(match, {}) for match in matches])
    found = [table.match for table in address_settings.matching(name)]
    assert sorted(found) == sorted(match for match in matches if reference_matches(match, name))
    assert found == most_specific_first(found)


def kinds(pattern: str) -> list[int]:
    return [0 if word == "#" else 1 if word == "*" else 2 for word in pattern.split(".")]


@settings(max_examples=400, deadline=None)
@given(patterns, patterns)
def test_specificity_follows_the_documented_rule(first, second):
    order = most_specific_first([first, second])
    if first == second:
        return
    winner = order[0]
    exact = [pattern for pattern in (first, second) if "*" not in pattern and "#" not in pattern]
    if len(exact) == 1:
        assert winner == exact[0]  # rule 1
        return
    first_kinds, second_kinds = kinds(first), kinds(second)
    for a, b in zip(first_kinds, second_kinds):
        if a != b:
            assert winner == (first if a > b else second)  # rule 2: literal > * > #
            return
    if len(first_kinds) != len(second_kinds):
        assert winner == (first if len(first_kinds) < len(second_kinds) else second)  # rule 3
    else:
        assert winner == min(first, second)  # rule 4


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(patterns, st.integers(-1, 50)), min_size=0, max_size=6,
                unique_by=lambda pair: pair[0]), names)
def test_each_setting_comes_from_the_most_specific_match_that_gives_it(pairs, name):
    given_buckets = {match: buckets for match, buckets in pairs}
    given_depth = {match: buckets + 1 for match, buckets in pairs if buckets % 2 == 0}  # only some tables
    address_settings = tables(*[(match, {"group_buckets": given_buckets[match],
                                         **({"depth_max_messages": given_depth[match]} if match in given_depth
                                            else {})}) for match, _ in pairs])
    settings_ = address_settings.settings_for(name)
    matched = most_specific_first([match for match, _ in pairs if reference_matches(match, name)])
    assert settings_.group_buckets == (given_buckets[matched[0]] if matched else -1)
    with_depth = [match for match in matched if match in given_depth]
    assert settings_.depth_max_messages == (given_depth[with_depth[0]] if with_depth
                                            else QueueSettings(name="x").depth_max_messages)


def test_a_literal_beats_a_star_which_beats_a_hash():
    address_settings = tables(("orders.#", {"group_buckets": 1}), ("orders.*", {"group_buckets": 2}),
                              ("orders.eu", {"group_buckets": 3}), ("#", {"group_buckets": 4}))
    assert address_settings.settings_for("orders.eu").group_buckets == 3
    assert address_settings.settings_for("orders.us").group_buckets == 2
    assert address_settings.settings_for("orders.us.west").group_buckets == 1
    assert address_settings.settings_for("orders").group_buckets == 1  # '#' matches zero words
    assert address_settings.settings_for("invoices").group_buckets == 4


def test_the_template_is_below_every_table_even_a_hash_one():
    address_settings = AddressSettings.from_config(
        [{"match": "#", "group_first_key": "first"}, {"match": "jobs.*", "group_rebalance": True}],
        {"group_first_key": "template-key", "group_buckets": 16})
    jobs = address_settings.settings_for("jobs.a")
    assert (jobs.group_first_key, jobs.group_rebalance, jobs.group_buckets) == ("first", True, 16)
    other = address_settings.settings_for("other")
    assert (other.group_first_key, other.group_rebalance, other.group_buckets) == ("first", False, 16)


def test_a_dead_letter_queue_keeps_its_messages_whatever_the_tables_say():
    address_settings = tables(("#", {"delivery_count_max": 3}))
    assert address_settings.settings_for("jobs.DLQ").delivery_count_max == 0
    assert address_settings.settings_for("jobs").delivery_count_max == 3


def write(tmp_path, text):
    path = tmp_path / "grouper.toml"
    path.write_text(text)
    return str(path)


def test_a_config_file_gives_auto_created_queues_their_address_settings(tmp_path):
    config = load(write(tmp_path, '[template]\ngroup_buckets = 8\n'
                                  '[[address-setting]]\nmatch = "orders.#"\ngroup-first-key = "First"\n'
                                  '[[address-setting]]\nmatch = "orders.eu"\ngroup_buckets = 0\n'), environ={})
    broker = Broker(address_settings=config.auto_create_settings())
    assert broker.queue("orders.eu", create=True).settings.group_buckets == 0
    assert broker.queue("orders.eu", create=True).settings.group_first_key == "First"
    assert broker.queue("orders.us", create=True).settings.group_buckets == 8


@pytest.mark.parametrize("text, key", [
    ('[[address-setting]]\ngroup_buckets = 1\n', "address-setting[0].match"),
    ('[[address-setting]]\nmatch = "a"\n[[address-setting]]\nmatch = "a.#x"\n', "address-setting[1].match"),
    ('[[address-setting]]\nmatch = "a..b"\n', "address-setting[0].match"),
    ('[[address-setting]]\nmatch = "a"\ngroup_bukets = 1\n', "address-setting[0].group_bukets"),
    ('[[address-setting]]\nmatch = "a"\ngroup_buckets = "many"\n', "address-setting[0].group_buckets"),
    ('[[address-setting]]\nmatch = "a"\ngroup_buckets = -7\n', "address-setting[0].group_buckets"),
    ('[[address-setting]]\nmatch = "a"\nname = "a"\n', "address-setting[0].name"),
    ('[[address-setting]]\nmatch = "a.*"\n[[address-setting]]\nmatch = "a.*"\n', "address-setting[1].match"),
    ('[[address-setting]]\nmatch = "a"\ngroup_rebalance_pause_dispatch = true\n',
     "address-setting[0].group_rebalance_pause_dispatch"),
    ('address-setting = 3\n', "address-setting"),
    ('[[address-setting]]\nmatch = "a"\ngroup_buckets = 1\ndefault-group-buckets = 2\n',
     "address-setting[0].default-group-buckets"),
    ('[[address-setting]]\nmatch = "a"\ngroup_buckets = 1\ngroup-buckets = 2\n', "address-setting[0].group-buckets"),
    ('[[address-setting]]\nmatch = "a"\ndefault-group-bucket = 2\n', "address-setting[0].default-group-bucket"),
])
def test_a_bad_address_setting_stops_the_node_naming_the_table_and_key(tmp_path, text, key):
    with pytest.raises(InvalidConfig) as caught:
        load(write(tmp_path, text), environ={})
    assert caught.value.key == key


def test_an_address_setting_takes_artemis_default_keys_for_the_group_parameters(tmp_path):
    config = load(write(tmp_path, '[[address-setting]]\nmatch = "my.address"\ndefault-group-buckets = 1024\n'
                                  'default-group-first-key = "JMSXGroupFirstForConsumer"\n'
                                  'default-group-rebalance = true\ndefault-group-rebalance-pause-dispatch = true\n'
                                  'default-delay-before-dispatch = 500\n'), environ={})
    settings_ = config.auto_create_settings().settings_for("my.address")
    assert (settings_.group_buckets, settings_.group_first_key, settings_.group_rebalance,
            settings_.group_rebalance_pause_dispatch, settings_.time_before_dispatch_ms) == (
        1024, "JMSXGroupFirstForConsumer", True, True, 500)


def test_a_pause_without_rebalance_is_fine_when_a_wider_match_turns_rebalance_on(tmp_path):
    config = load(write(tmp_path, '[[address-setting]]\nmatch = "a.#"\ngroup_rebalance = true\n'
                                  '[[address-setting]]\nmatch = "a.b"\ngroup_rebalance_pause_dispatch = true\n'),
                  environ={})
    assert config.auto_create_settings().settings_for("a.b").group_rebalance_pause_dispatch


def test_an_address_splits_into_queue_and_parameters():
    assert split_address("orders") == ("orders", {})
    assert split_address("orders?") == ("orders", {})
    assert split_address("orders?group-buckets=1024&group-first-key=JMSXGroupFirstForConsumer") == (
        "orders", {"group_buckets": 1024, "group_first_key": "JMSXGroupFirstForConsumer"})
    assert split_address("orders?group-rebalance=TRUE&group-rebalance-pause-dispatch=true") == (
        "orders", {"group_rebalance": True, "group_rebalance_pause_dispatch": True})
    assert split_address("o?consumers-before-dispatch=2&delay-before-dispatch=500") == (
        "o", {"consumers_before_dispatch": 2, "time_before_dispatch_ms": 500})


@pytest.mark.parametrize("address, words", [
    ("orders?group-bucket=8", "'group-bucket' is unknown"),
    ("orders?group-buckets=many", "expected an integer"),
    ("orders?group-buckets=-2", "must be -1"),
    ("orders?group-rebalance=yes", "expected true or false"),
    ("orders?group-buckets", "has no value"),
    ("orders?group-buckets=1&group-buckets=2", "given twice"),
    ("?group-buckets=1", "no queue name"),
])
def test_a_bad_parameter_is_refused_by_name(address, words):
    with pytest.raises(InvalidField) as caught:
        split_address(address)
    assert words in caught.value.description


def test_parameters_shape_a_new_queue_and_must_equal_an_existing_ones():
    broker = Broker(address_settings=tables(("orders", {"group_buckets": 4})))
    created = broker.queue("orders.eu", create=True, parameters={"group_buckets": 1024, "group_first_key": "F"})
    assert (created.settings.group_buckets, created.settings.group_first_key) == (1024, "F")
    assert broker.queue("orders.eu", create=True, parameters={"group_buckets": 1024}) is created
    with pytest.raises(AlreadyExists) as caught:
        broker.queue("orders.eu", create=True, parameters={"group_buckets": 8})
    assert "group-buckets=1024" in caught.value.description and "group-buckets=8" in caught.value.description
    assert broker.queue("orders", create=True).settings.group_buckets == 4


def test_check_parameters_names_booleans_as_the_address_spells_them():
    with pytest.raises(AlreadyExists) as caught:
        check_parameters(QueueSettings(name="q"), {"group_rebalance": True})
    assert "group-rebalance=false" in caught.value.description and "group-rebalance=true" in caught.value.description


def test_parameters_never_create_a_queue_when_auto_create_is_off():
    broker = Broker(auto_create=False)
    with pytest.raises(NotFound):
        broker.queue("orders", create=True, parameters={"group_buckets": 8})
