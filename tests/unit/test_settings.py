"""Examples of queue settings: defaults, the cross-field rules, and building them from config tables."""

from __future__ import annotations

import dataclasses

import pytest

from node.core.errors import InvalidConfig
from node.core.dispatch.settings import GROUP_ID_LENGTH_MAX_CHARS, QPID_DEFAULT_GROUP, QueueSettings


def refused_key(**values) -> str:
    with pytest.raises(InvalidConfig) as raised:
        QueueSettings(**{"name": "q", **values}).validate()
    return raised.value.key


def test_the_defaults_are_valid_and_name_an_exclusive_durable_grouped_queue():
    settings = QueueSettings(name="q").validate()
    assert settings.group_policy == "exclusive"
    assert settings.durable
    assert settings.grouping
    assert settings.group_buckets == -1


def test_every_field_has_a_default_except_the_name():
    without_default = [f.name for f in dataclasses.fields(QueueSettings)
                       if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    assert without_default == ["name"]


def test_settings_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        QueueSettings(name="q").group_policy = "shared"


@pytest.mark.parametrize("name", ["", "x" * 256])
def test_a_queue_name_must_be_1_to_255_characters(name):
    assert refused_key(name=name) == "name"


def test_an_unknown_policy_is_refused_and_the_choices_are_named():
    with pytest.raises(InvalidConfig) as raised:
        QueueSettings(name="q", group_policy="sticky").validate()
    assert raised.value.key == "group_policy"
    assert "exclusive, shared, none" in str(raised.value)
    assert raised.value.fault == "operator"


def test_group_buckets_below_minus_one_are_refused():
    assert refused_key(group_buckets=-2) == "group_buckets"


@pytest.mark.parametrize("key", ["consumers_before_dispatch", "time_before_dispatch_ms", "depth_max_messages",
                                 "depth_max_bytes", "delivery_count_max"])
def test_counts_and_durations_cannot_be_negative(key):
    assert refused_key(**{key: -1}) == key


@pytest.mark.parametrize("limit", [0, GROUP_ID_LENGTH_MAX_CHARS + 1])
def test_the_group_id_length_limit_stays_within_its_hard_ceiling(limit):
    assert refused_key(group_id_length_max_chars=limit) == "group_id_length_max_chars"


def test_pausing_dispatch_on_rebalance_needs_rebalance():
    assert refused_key(group_rebalance_pause_dispatch=True) == "group_rebalance_pause_dispatch"
    QueueSettings(name="q", group_rebalance=True, group_rebalance_pause_dispatch=True).validate()


def test_a_queue_cannot_be_its_own_dead_letter_queue():
    assert refused_key(dead_letter_queue="q") == "dead_letter_queue"


@pytest.mark.parametrize("policy, buckets, grouping", [
    ("exclusive", -1, True), ("shared", 8, True), ("none", -1, False), ("exclusive", 0, False)])
def test_grouping_is_off_for_policy_none_and_for_zero_buckets(policy, buckets, grouping):
    assert QueueSettings(name="q", group_policy=policy, group_buckets=buckets).grouping is grouping


def test_the_default_group_is_qpids_in_shared_queues_and_none_in_exclusive_ones():
    assert QueueSettings(name="q", group_policy="shared").effective_default_group == QPID_DEFAULT_GROUP
    assert QPID_DEFAULT_GROUP == "qpid.no-group"
    assert QueueSettings(name="q", group_policy="exclusive").effective_default_group is None
    assert QueueSettings(name="q", default_group="dg").effective_default_group == "dg"


# ---- from config tables --------------------------------------------------------------------------

def test_a_config_table_accepts_qpid_config_spellings():
    settings = QueueSettings.from_dict({"name": "q", "group-header": "GROUP_KEY", "shared-groups": True})
    assert settings.group_header == "GROUP_KEY"
    assert settings.group_policy == "shared"


def test_shared_groups_false_leaves_the_policy_alone():
    assert QueueSettings.from_dict({"name": "q", "shared_groups": False}).group_policy == "exclusive"


def test_a_config_table_round_trips_through_to_dict():
    settings = QueueSettings(name="q", group_policy="shared", group_buckets=16, dead_letter_queue="dlq")
    assert QueueSettings.from_dict(settings.to_dict()) == settings


def test_an_unknown_key_is_named_with_where_it_was_found():
    with pytest.raises(InvalidConfig) as raised:
        QueueSettings.from_dict({"name": "q", "group_bucket": 4}, where="queue[2]")
    assert raised.value.key == "queue[2].group_bucket"
    assert "unknown setting" in str(raised.value)


@pytest.mark.parametrize("key, value", [
    ("durable", 1), ("durable", "yes"), ("group_buckets", True), ("group_buckets", "4"),
    ("group_buckets", 4.0), ("default_group", 3), ("name", 5)])
def test_a_mistyped_value_is_refused_naming_the_key(key, value):
    with pytest.raises(InvalidConfig) as raised:
        QueueSettings.from_dict({"name": "q", key: value})
    assert raised.value.key == f"queue.{key}"


def test_a_missing_name_is_refused():
    with pytest.raises(InvalidConfig) as raised:
        QueueSettings.from_dict({"group_policy": "shared"})
    assert raised.value.key == "queue.name"


def test_a_cross_field_problem_from_a_table_names_the_key_with_where_it_was_found():
    with pytest.raises(InvalidConfig) as raised:
        QueueSettings.from_dict({"name": "q", "dead_letter_queue": "q"}, where="template")
    assert raised.value.key == "template.dead_letter_queue"
    assert str(raised.value) == "template.dead_letter_queue: a queue cannot be its own dead-letter queue"
