"""Dead letters: where a rejected or over-delivered message of a queue goes. Pure.

Rules:
- Dead letters (rejected, or past `delivery_count_max`) go to the source's `dead_letter_queue_name`
  (`<queue>.DLQ` by default), created from the address settings when missing if the source's
  `dead_letter_queue_auto_create` allows. A queue auto-created under a `.DLQ` name is a dead-letter
  queue: unlimited deliveries and no dead-letter queue of its own, since an operator drains it.
- A dead letter is never dropped silently: when no dead-letter queue can take it (none may be
  created, or it is full), an over-delivered message stays in its queue (`Kept`) and a rejected one
  is dropped with a `Dropped` saying why (its consumer refused it for good). Room is reserved per
  broker call (`reserved`, cleared by the broker at each settle or detach), so one call's dead letters
  never overfill their queue together.
- A dead letter keeps its group id and delivery count; `Broker.dead_letter_stamp` (the adapter's codec)
  may rewrite its payload to record the original queue and the reason. It moves as node/core/dispatch/
  moves.py moves messages: stored at the destination before it is removed from its source.
"""

from __future__ import annotations

from node.core.dispatch.message import Message
from node.core.dispatch.queue import Queue
from node.core.effects import DeadLettered
from node.core.errors import GrouperError


class DeadLetters:
    def __init__(self, broker, moves):
        self.broker = broker
        self.moves = moves
        self.reserved: dict[str, tuple[int, int]] = {}  # DLQ -> (messages, bytes) promised this call

    def refusal(self, source: Queue, message: Message) -> str | None:
        """None when `message` of `source` can be dead-lettered now (creating the dead-letter queue if
        allowed, and reserving room in it); else why not, for a log line."""
        name = source.settings.dead_letter_queue_name
        if name == source.settings.name:
            return "a queue cannot be its own dead-letter queue"
        broker = self.broker
        target = broker.queues.get(name)
        if target is None:
            if not source.settings.dead_letter_queue_auto_create:
                return (f"dead-letter queue {name!r} does not exist and dead_letter_queue_auto_create is off "
                        f"for {source.settings.name!r}; declare it with 'grouper queue add {name}'")
            try:
                target = broker.make_queue(broker.address_settings.settings_for(name))
            except GrouperError as error:
                return f"dead-letter queue {name!r} cannot be created: {error.description}"
        count, size_bytes = self.reserved.get(name, (0, 0))
        try:
            target.check_capacity(size_bytes + message.size_bytes, count + 1)
        except GrouperError as error:
            return f"dead-letter queue {name!r} is full: {error.description}"
        self.reserved[name] = (count + 1, size_bytes + message.size_bytes)
        return None

    def send(self, source: Queue, dead: list[tuple[Message, str]], now_ms: int, effects: list) -> None:
        """Copy `dead` (message, reason), already removed from `source`, into its dead-letter queue."""
        target = self.broker.queues[source.settings.dead_letter_queue_name]  # created by `refusal`
        copies = self.moves.transfer(source, target, [message for message, _ in dead], now_ms, effects,
                                     [reason for _, reason in dead])
        for (message, reason), copy in zip(dead, copies):
            effects.append(DeadLettered(source.settings.name, message.seq, target.settings.name, copy.seq, reason))
