"""What a queue keeps of messages it has removed: tombstones in its browse log, bounded in bytes too.

Found by bench/soak.py: 1 MiB messages sent and accepted one at a time grew the node ~1 MiB each,
because the browse log kept 1,024 tombstones (with their payloads) before compacting.
"""

from __future__ import annotations

from node.core.dispatch.broker import Broker
from node.core.effects import Deliver
from node.core.dispatch.message import Message, Outcome
from node.core.dispatch.queue_store import LOG_COMPACT_MIN_BYTES
from node.core.dispatch.settings import QueueSettings

MESSAGE_BYTES = 1 << 20


def payload_bytes_kept(queue) -> int:
    return sum(message.size_bytes for message in queue._store.log)  # tombstones included: what stays alive


def test_accepted_large_messages_do_not_stay_alive_in_the_browse_log():
    broker = Broker()
    queue = broker.declare_queue(QueueSettings(name="q", durable=False))
    broker.attach_consumer("q", "c1", False, 0)
    broker.set_credit("c1", 1, 0)
    for index in range(100):
        effects = broker.enqueue("q", Message(bytes(MESSAGE_BYTES), "g"), index)
        [deliver] = [effect for effect in effects if type(effect) is Deliver]
        broker.settle("c1", deliver.delivery_id, Outcome.ACCEPTED, index)
        broker.set_credit("c1", 1, index)
    assert queue.stats()["depth_messages"] == 0
    assert payload_bytes_kept(queue) <= LOG_COMPACT_MIN_BYTES + MESSAGE_BYTES



def test_a_paged_backlog_drained_keeps_tombstones_within_its_resident_bytes_not_its_depth():
    # found with 1 MiB messages past both budgets (bodies paged, records cold): each body read back and
    # accepted stayed alive in its tombstone until the tombstones' bytes passed the queue's depth, paged
    # and cold bytes included: the node's resident set grew ~1 MiB a message, 400 MB at 400 messages
    from node.core.effects import PageIn
    from node.core.dispatch.message import JOURNALLED, REMOVED, STATE_MASK
    from node.core.dispatch.queue import Queue

    body_bytes, budget_bytes, count = 256 << 10, 1 << 20, 400  # a 100 MiB backlog, 1 MiB of it resident
    queue = Queue(QueueSettings(name="q", memory_max_bytes=budget_bytes))
    effects: list = []
    disk = {}
    for seq in range(1, count + 1):
        queue.enqueue(Message(bytes(body_bytes), "g", seq=seq), 0, effects)
        disk[seq] = bytes(body_bytes)
    for message in queue.browse_available():
        message.flags |= JOURNALLED
    queue.page_out(budget_bytes)
    effects = []
    queue.attach("c", False, 0, effects)
    queue.set_credit("c", 1, 0, effects)
    accepted, kept_max = 0, 0
    while accepted < count:
        asked = [seq for effect in effects if type(effect) is PageIn for seq in effect.seqs]
        delivered = [effect for effect in effects if type(effect) is Deliver]
        effects = []
        if asked:
            queue.page_in({seq: disk[seq] for seq in asked}, 0, effects)
        for deliver in delivered:
            queue.settle("c", deliver.delivery_id, Outcome.ACCEPTED, False, 0, effects)
            queue.set_credit("c", 1, 0, effects)
            accepted += 1
        assert asked or delivered, f"stuck after {accepted} accepted"
        kept_max = max(kept_max, sum(m.size_bytes for m in queue._store.log
                                     if m.payload is not None and m.flags & STATE_MASK == REMOVED))
    assert queue.depth_messages == 0
    assert kept_max <= LOG_COMPACT_MIN_BYTES + body_bytes, kept_max  # the resident bytes are less here
