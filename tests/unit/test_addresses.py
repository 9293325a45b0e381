"""Multicast addresses: names, bindings, the fan-out tally, the broker's subscriptions and the config."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from node import config
from node.core.dispatch.address_settings import AddressSettings
from node.core.dispatch.addresses import Addresses, SendTally, split_fqqn, subscription_name
from node.core.dispatch.broker import Broker
from node.core.cluster.feed import fixed_changes
from node.core.errors import AlreadyExists, InvalidConfig, InvalidField, NotFound, ResourceLimitExceeded
from node.core.dispatch.message import Message
from node.core.dispatch.settings import QueueSettings


def test_a_fully_qualified_name_splits_at_the_first_double_colon():
    assert split_fqqn("prices::prices.audit") == ("prices", "prices.audit")
    assert split_fqqn("a::b::c") == ("a", "b::c")
    assert split_fqqn("prices.audit") is None


@pytest.mark.parametrize("address", ["::q", "prices::", "::"])
def test_a_fully_qualified_name_needs_both_parts(address):
    with pytest.raises(InvalidField, match="ADDRESS::QUEUE"):
        split_fqqn(address)


def test_a_durable_subscription_is_named_from_container_and_link_a_temporary_one_also_from_the_link_id():
    assert subscription_name("app-1", "sub-1", True, 7) == "app-1.sub-1"
    assert subscription_name("app-1", "sub-1", False, 7) == "app-1.sub-1.7"
    assert subscription_name("app-1", "sub-1", False, 8) != subscription_name("app-1", "sub-1", False, 7)


def test_a_subscription_name_that_cannot_be_a_queue_name_is_refused_saying_why():
    with pytest.raises(InvalidField, match="at most 255"):
        subscription_name("c" * 200, "l" * 100, True, 1)
    with pytest.raises(InvalidField, match="link name"):
        subscription_name("c", "", True, 1)
    with pytest.raises(InvalidField, match="control characters"):
        subscription_name("c\n", "l", True, 1)


def test_bindings_are_kept_in_name_order_and_an_address_outlives_its_queues():
    addresses = Addresses(("prices",))
    assert addresses.is_multicast("prices") and addresses.subscriptions("prices") == ()
    addresses.bind("prices", "prices.z")
    addresses.bind("prices", "prices.a")
    addresses.bind("prices", "prices.a")
    assert addresses.subscriptions("prices") == ("prices.a", "prices.z")
    addresses.unbind("prices", "prices.a")
    addresses.unbind("prices", "prices.z")
    assert addresses.is_multicast("prices") and addresses.subscriptions("prices") == ()
    assert not addresses.is_multicast("orders") and addresses.subscriptions("orders") == ()


@given(st.lists(st.one_of(st.none(), st.sampled_from(["full", "journal down", "bad group"])), min_size=1,
                max_size=20))
def test_a_tally_settles_once_after_the_last_copy_with_the_first_refusal(outcomes):
    tally = SendTally(len(outcomes))
    finished = [tally.settle(outcome) for outcome in outcomes]
    assert finished == [False] * (len(outcomes) - 1) + [True]
    assert tally.refusal == next((outcome for outcome in outcomes if outcome is not None), None)
    with pytest.raises(AssertionError):
        tally.settle(None)


def subscription(name: str, address: str, **settings) -> QueueSettings:
    return QueueSettings(name=name, address=address, **settings)


def test_declaring_a_subscription_queue_binds_it_and_deleting_it_unbinds_it():
    broker = Broker(multicast_addresses=("prices",))
    broker.declare_queue(subscription("prices.b", "prices"))
    broker.declare_queue(subscription("prices.a", "prices", group_buckets=0))
    broker.declare_queue(QueueSettings(name="orders"))
    assert broker.addresses.subscriptions("prices") == ("prices.a", "prices.b")
    broker.delete_queue("prices.a")
    assert broker.addresses.subscriptions("prices") == ("prices.b",)


def test_a_multicast_address_is_never_made_a_queue_of_its_name():
    broker = Broker(multicast_addresses=("prices",))
    with pytest.raises(NotFound, match="prices::QUEUE"):
        broker.queue("prices", create=True)
    with pytest.raises(AlreadyExists, match="multicast address"):
        broker.declare_queue(QueueSettings(name="prices"))
    assert "prices" not in broker.queues


def test_a_subscription_an_attach_makes_takes_the_address_settings_of_its_address():
    broker = Broker(address_settings=AddressSettings.from_config(
        [{"match": "prices.#", "group_first_key": "First"}], {}))
    queue = broker.subscribe("prices", "app.sub", durable=False)
    assert queue.settings.address == "prices" and queue.settings.group_first_key == "First"
    assert not queue.settings.durable
    assert broker.addresses.subscriptions("prices") == ("app.sub",)
    with pytest.raises(AlreadyExists):
        broker.subscribe("prices", "app.sub")


def test_a_subscription_queue_keeps_its_address_through_its_journal_record():
    settings = subscription("prices.audit", "prices", group_buckets=0)
    assert QueueSettings.from_dict(settings.to_dict()) == settings
    assert "address" not in QueueSettings(name="orders").to_dict()  # other queues' records are unchanged


def test_a_subscription_queue_cannot_share_its_address_name():
    with pytest.raises(InvalidConfig, match="address"):
        subscription("prices", "prices").validate()


def write(tmp_path, text: str) -> str:
    path = tmp_path / "grouper.toml"
    path.write_text(text)
    return str(path)


def test_address_tables_declare_the_address_and_its_subscription_queues(tmp_path):
    loaded = config.load(write(tmp_path, """
[[address]]
name = "prices"
routing = "multicast"

[[address.queue]]
name = "prices.audit"
group_buckets = 0

[[address.queue]]
name = "prices.by-symbol"
group_first_key = "First"

[[address]]
name = "alerts"

[[queue]]
name = "alerts.mail"
address = "alerts"
"""), environ={})
    assert loaded.multicast_addresses == ("prices", "alerts")
    by_name = {q.name: q for q in loaded.queues}
    assert by_name["prices.audit"].address == "prices" and by_name["prices.audit"].group_buckets == 0
    assert by_name["prices.by-symbol"].group_first_key == "First"
    assert by_name["alerts.mail"].address == "alerts"


@pytest.mark.parametrize("text, key, message", [
    ('[[address]]\nname = "p"\nrouting = "anycast"\n', "address[0].routing", "declare it as [[queue]]"),
    ('[[address]]\nname = "p"\nfilter = "x"\n', "address[0].filter", "unknown key"),
    ('[[address]]\nname = "p::q"\n', "address[0].name", "'::'"),
    ('[[address]]\nname = "p"\n[[address]]\nname = "p"\n', "address[1].name", "earlier"),
    ('[[address]]\nname = "p"\n[[address.queue]]\nname = "q"\ngroup_bukets = 0\n', "address[0].queue[0].group_bukets",
     "unknown setting"),
    ('[[address]]\nname = "p"\n[[address.queue]]\nname = "q"\naddress = "r"\n', "address[0].queue[0].address",
     "subscribes to it"),
    ('[[address]]\nname = "p"\n[[queue]]\nname = "p"\n', "address.name", "both a multicast address and a queue"),
    ('[[queue]]\nname = "p"\n[[queue]]\nname = "q"\naddress = "p"\n', "address.name", "both"),
    ('[template]\naddress = "p"\n', "template.address", "declared, not matched"),
])
def test_a_bad_address_table_stops_the_node_naming_the_key(tmp_path, text, key, message):
    with pytest.raises(InvalidConfig) as raised:
        config.load(write(tmp_path, text), environ={})
    assert raised.value.key == key, raised.value
    assert message in str(raised.value)


class Arrival:
    """What the adapter's codec reads of a message for one group header (node/amqp/codec.read_arrival)."""

    def __init__(self, group_id):
        self.group_id = group_id


@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["", "Symbol"])), min_size=1, max_size=4),
       st.lists(st.tuples(st.sampled_from(["IBM", "ACME", "x" * 300]), st.integers(1, 40)), max_size=25))
def test_a_send_is_copied_to_every_subscription_or_to_none_against_a_model(subscriptions, sends):
    broker = Broker(multicast_addresses=("prices",))
    limits = {}
    for index, (depth_max_messages, header) in enumerate(subscriptions):
        name = f"prices.{index}"
        broker.declare_queue(QueueSettings(name=name, address="prices", depth_max_messages=depth_max_messages,
                                           group_header=header, group_policy="none" if index % 2 else "exclusive"))
        limits[name] = depth_max_messages
    model = {name: [] for name in limits}  # what each subscription holds, in order
    for group, size_bytes in sends:
        reads = []

        def read(header):
            reads.append(header)
            return Arrival(group if not header else f"{group}@{header}")
        room = len(group) <= 255 and all(not limit or len(model[name]) < limit for name, limit in limits.items())
        try:
            copies = broker.copies("prices", size_bytes, read)
        except (InvalidField, ResourceLimitExceeded):
            assert not room
        else:
            assert room
            assert [queue.settings.name for queue, _ in copies] == sorted(limits)
            for queue, arrival in copies:
                broker.enqueue(queue.settings.name, Message(b"m" * size_bytes, arrival.group_id), 0)
                model[queue.settings.name].append(arrival.group_id)
        assert len(reads) == len(set(reads)) <= len({header for _, header in subscriptions})
        for name, held in model.items():
            assert broker.queues[name].depth_messages == len(held)
            assert [m.group_id for m in broker.queues[name].browse_available()] == held


def test_a_multicast_address_without_subscriptions_has_no_copies():
    broker = Broker(multicast_addresses=("alerts",))
    assert broker.copies("alerts", 10, lambda header: Arrival("IBM")) == []


def test_a_cluster_definition_that_would_change_a_live_queues_address_counts_as_a_fixed_change():
    bound, unbound = subscription("prices.audit", "prices"), QueueSettings(name="prices.audit")
    assert fixed_changes(dataclasses.asdict(bound), dataclasses.asdict(unbound)) == ["address"]
    assert fixed_changes(dataclasses.asdict(unbound), dataclasses.asdict(bound)) == ["address"]
