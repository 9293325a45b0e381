from node.core.dispatch.broker import Broker
from node.core.dispatch.settings import QueueSettings


def test_a_rebalance_waits_for_the_new_consumers_first_credit(make):
    h = make(group_rebalance=True, durable=False)
    h.attach("c1", 10)
    h.send("a", "a1")
    h.accept("a1")
    h.attach("c2")  # attached, no credit yet: c1 keeps group a meanwhile
    assert h.owners() == {"a": "c1"}
    h.send("a", "a2")
    assert h.log[-1] == ("c1", "a2")
    h.accept("a2")
    h.credit("c2", 10)  # now the reset happens, and c2 (no groups) takes the next new group
    assert h.owners() == {}
    h.send("a", "a3")
    assert h.log[-1] == ("c2", "a3")


def test_dead_letters_beyond_the_dead_letter_queues_depth_are_dropped_with_a_reason(make):
    broker = Broker()
    broker.declare_queue(QueueSettings(name="dlq", durable=False, depth_max_messages=1))
    h = make(broker=broker, dead_letter_queue="dlq", durable=False)
    h.attach("c1", 10)
    h.send("a", "a1")
    h.send("a", "a2")
    h.reject("a1")
    assert h.dropped() == []
    h.reject("a2")
    assert [reason.split(":")[0] for _, _, reason in h.dropped()] == ["rejected; dead-letter queue 'dlq' is full"]
    assert broker.queues["dlq"].depth_messages == 1


def test_a_message_of_a_new_group_beyond_groups_max_is_refused_and_known_groups_still_flow(make):
    import pytest
    from node.core.errors import ResourceLimitExceeded

    h = make(groups_max=2, durable=False)
    h.send("a", "a1")
    h.send("b", "b1")
    with pytest.raises(ResourceLimitExceeded, match="groups_max=2"):
        h.send("c", "c1")
    h.send("a", "a2")
    h.send(None, "loose")  # ungrouped messages track no group
    assert h.stats()["groups"] == 2 and h.stats()["depth_messages"] == 4


def test_a_consumer_at_its_unsettled_cap_gets_nothing_more_until_it_settles():
    from node.core.effects import Deliver
    from node.core.dispatch.message import Message, Outcome

    broker = Broker()
    broker.declare_queue(QueueSettings(name="q", durable=False))
    for index in range(5):
        broker.enqueue("q", Message(b"m%d" % index, None), now_ms=0)
    broker.attach_consumer("q", "c1", False, 0, unsettled_max=2)
    delivered = [e for e in broker.set_credit("c1", 100, 0) if isinstance(e, Deliver)]
    assert [e.message.payload for e in delivered] == [b"m0", b"m1"]
    more = [e for e in broker.settle("c1", delivered[0].delivery_id, Outcome.ACCEPTED, 0) if isinstance(e, Deliver)]
    assert [e.message.payload for e in more] == [b"m2"]
    assert broker.queues["q"].consumers["c1"].credit == 97
