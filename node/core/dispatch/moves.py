"""Messages moving between one node's queues: an admin group move, and a dead letter's copy. Pure.

Rules:
- A moving message is `Stored` at its destination before it is `Removed` from its source, so a torn
  journal tail can duplicate it but never lose it.
- Its copy takes a new node-wide seq (Broker.next_seq), keeps its group id, delivery count, expiry and
  enqueue time; once copied it is handed out (a failed write can no longer take it back).
- A move is refused before anything changes when the destination has no room or is the source, or
  when the source keeps the group's tail cold (its records are read back first).
- In a cluster every group given messages here is recorded (node/core/dispatch/local_changes.py).
"""

from __future__ import annotations

from node.core.dispatch.message import Message
from node.core.dispatch.queue import Queue
from node.core.effects import Removed, Stored
from node.core.errors import AlreadyExists


class Moves:
    def __init__(self, broker):
        self.broker = broker

    def move_group(self, queue_name: str, group: str, destination: str, count: int | None,
                   now_ms: int) -> tuple[int, list]:
        """The admin `group move`: up to `count` (None: all) of `group`'s messages, oldest first."""
        source = self.broker.queue(queue_name)
        target = self.broker.queue(destination)
        if target is source:
            raise AlreadyExists(f"cannot move group {group!r} of {queue_name!r} onto itself")
        source.cold_refusal(f"moving group {group!r}")
        moving = source.group_head_messages(group, count)
        target.check_capacity(sum(m.size_bytes for m in moving), len(moving))  # refuse before touching anything
        effects: list = []
        taken = source.take_group_messages(group, count, effects)
        self.transfer(source, target, taken, now_ms, effects)
        source.tick(now_ms, effects)
        return len(taken), effects

    def transfer(self, source: Queue, target: Queue, messages: list[Message], now_ms: int,
                 effects: list, dead_letter_reasons: list[str] | None = None) -> list[Message]:
        """Copy already-removed messages into `target`, journalling them before their removal.
        With `dead_letter_reasons` the copies are dead letters, stamped (`dead_letter_stamp`) with why."""
        broker = self.broker
        stored: list = []
        copies: list[Message] = []
        seqs = {m.seq for m in messages}
        stamp = broker.dead_letter_stamp if dead_letter_reasons is not None else None
        local = broker.local
        for index, old in enumerate(messages):
            old.handed_out = True  # its copy lives on in `target`: a failed write cannot take it back
            payload = old.payload
            if stamp is not None:
                payload = stamp(payload, source.settings.name, dead_letter_reasons[index])
            message = Message(payload, old.group_id, expires_at_ms=old.expires_at_ms,
                              closes_group=old.closes_group, delivery_count=old.delivery_count,
                              enqueued_at_ms=old.enqueued_at_ms, seq=broker.next_seq)
            broker.next_seq += 1
            target.restore(message)
            copies.append(message)
            if local is not None:
                route_key = target.route_key(message.group_id)
                if route_key is not None:
                    local.entered.add((target.settings.name, route_key))
            target.enqueued_total += 1
            if target.settings.durable:
                stored.append(Stored(target.settings.name, message))
        first_removal = next((i for i, e in enumerate(effects)
                              if isinstance(e, Removed) and e.queue == source.settings.name
                              and e.seq in seqs), len(effects))
        effects[first_removal:first_removal] = stored
        target.tick(now_ms, effects)
        return copies
