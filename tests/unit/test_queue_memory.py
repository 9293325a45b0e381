"""What a queue keeps of messages it has removed: tombstones in its browse log, bounded in bytes too.

Found by bench/soak.py: 1 MiB messages sent and accepted one at a time grew the node ~1 MiB each,
because the browse log kept 1,024 tombstones (with their payloads) before compacting.
"""

from __future__ import annotations

from node.core.broker import Broker
from node.core.effects import Deliver
from node.core.message import Message, Outcome
from node.core.queue import LOG_COMPACT_MIN_BYTES
from node.core.settings import QueueSettings

MESSAGE_BYTES = 1 << 20


def payload_bytes_kept(queue) -> int:
    return sum(message.size_bytes for message in queue._log)  # tombstones included: what stays alive


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

