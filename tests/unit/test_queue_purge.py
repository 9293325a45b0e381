"""node.admin.queue_purge over a real core Broker: batch by batch, every available message goes and
every delivered one stays, whatever the batch size and however many groups empty on the way."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from node.admin.queue_purge import available_left, purge_batch
from node.core.dispatch.broker import Broker
from node.core.dispatch.message import Message
from node.core.dispatch.settings import QueueSettings


def purge_all(queue, groups_max: int) -> tuple[int, int]:
    """(messages purged, batches run)."""
    purged, position, done, batches = 0, 0, False, 0
    # each batch but the last takes groups_max groups, then messages in no group as many at a time
    batches_max = len(queue.groups) // groups_max + len(queue._groups.ungrouped) // groups_max + 2
    while not done:
        count, position, done = purge_batch(queue, position, 2000, [], groups_max=groups_max)
        purged += count
        batches += 1
        assert batches <= batches_max, "the batches do not get to the end"
    return purged, batches


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 4), max_size=30), credit=st.integers(0, 5), groups_max=st.integers(1, 8))
def test_every_available_message_goes_and_delivered_ones_stay(sizes, credit, groups_max):
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q"))
    for index, size in enumerate(sizes):
        for _ in range(size):
            broker.enqueue("q", Message(b"x", f"g{index}"), 1000)
    broker.attach_consumer("q", 1, False, 1000)
    broker.set_credit(1, credit, 1000)  # some messages delivered: they stay
    queue = broker.queue("q")
    acquired = queue.acquired_messages
    purged, _ = purge_all(queue, groups_max)
    assert purged == sum(sizes) - acquired
    assert queue.depth_messages == acquired == queue.acquired_messages
    assert all(group.available_count == 0 for group in queue.groups.values())


def test_a_batch_looks_at_most_its_groups():
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q"))
    for index in range(25):
        broker.enqueue("q", Message(b"x", f"g{index}"), 1000)
    purged, position, done = purge_batch(broker.queue("q"), 0, 2000, [], groups_max=10)
    assert (purged, position, done) == (10, 0, False)  # its 10 groups emptied and forgotten: the rest moved up
    assert purge_all(broker.queue("q"), 10) == (15, 2)


def test_messages_in_no_group_go_too_after_the_groups_a_batch_at_a_time_and_delivered_ones_stay():
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q"))
    for group in ("a", None, "b", None, None, None, None):
        broker.enqueue("q", Message(b"x", group), 1000)
    broker.attach_consumer("q", 1, False, 1000)
    broker.set_credit(1, 1, 1000)  # 'a' delivered: it stays with its consumer
    queue = broker.queue("q")

    assert purge_all(queue, 2) == (6, 4)  # the groups' batch, then the 5 loose messages 2 at a time
    assert available_left(queue) == 0 and queue.depth_messages == 1 == queue.acquired_messages
    assert not queue._groups.ungrouped  # no tombstones left in the lane
    broker.enqueue("q", Message(b"y", None), 1000)
    assert purge_batch(queue, 0, 2000, [], groups_max=2)[0] == 1  # the lane still takes new ones
