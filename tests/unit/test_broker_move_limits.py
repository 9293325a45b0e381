import pytest

from node.core.dispatch.broker import Broker
from node.core.errors import ResourceLimitExceeded
from node.core.dispatch.message import Message
from node.core.dispatch.settings import QueueSettings


def _broker_with_group(messages: int) -> Broker:
    broker = Broker()
    broker.declare_queue(QueueSettings(name="source", durable=False))
    broker.declare_queue(QueueSettings(name="target", durable=False, depth_max_messages=3))
    for index in range(messages):
        broker.enqueue("source", Message(b"m%d" % index, "g"), now_ms=0)
    return broker


def test_moving_a_group_into_a_queue_without_room_is_refused_and_changes_nothing():
    broker = _broker_with_group(5)
    with pytest.raises(ResourceLimitExceeded, match="depth_max_messages=3"):
        broker.move_group("source", "g", "target", None, now_ms=0)
    assert broker.list_groups("source") == [{"group": "g", "messages": 5, "acquired": 0, "consumer": None}]
    assert broker.queues["target"].depth_messages == 0


def test_a_counted_move_that_fits_moves_the_group_head_in_order():
    broker = _broker_with_group(5)
    moved, _ = broker.move_group("source", "g", "target", 3, now_ms=0)
    assert moved == 3
    bodies = [m.payload for m in broker.queues["target"].browse_available()]
    assert bodies == [b"m0", b"m1", b"m2"]
    assert [m.payload for m in broker.queues["source"].browse_available()] == [b"m3", b"m4"]



def test_a_refused_send_to_an_unknown_queue_leaves_no_declaration_to_journal():
    from node.core.errors import InvalidField

    broker = Broker(template=QueueSettings(name="template", group_id_length_max_chars=1))
    with pytest.raises(InvalidField):
        broker.enqueue("fresh", Message(b"x", "too-long"), now_ms=0)
    assert "fresh" not in broker.queues
    assert broker.declared == []
