"""The node core: every queue of one node, its consumers, and the moves between queues.

Pure like the queues it owns: callers pass `now_ms` and carry out the returned effects in order.
Rules:
- `seq` is assigned here, node-wide and increasing, so queue order survives moves and recovery.
- A message moving between queues (move, dead-letter) is `Stored` at its destination before it is
  `Removed` from its source, so a torn journal tail can duplicate it but never lose it.
- Consumer ids and delivery ids are opaque to the core; the adapter chooses consumer ids.
- A durable send whose journal write failed is taken back if no consumer, browser or other queue has
  it yet (`take_back`); otherwise it stays where it is: delivered already, it cannot be unsent, so its
  producer is told the outcome is unknown. Such a message is in no journal: settled, it is removed
  with a REMOVE record for a seq the journal never stored, which recovery and compaction ignore;
  released, it is delivered again from memory; a restart forgets it.
"""

from __future__ import annotations

import dataclasses

from node.core.effects import DetachConsumer, Dropped, Removed, Stored
from node.core.errors import AlreadyExists, GrouperError, NotFound
from node.core.message import AVAILABLE, Message, Outcome
from node.core.queue import Queue
from node.core.settings import QueueSettings


class Broker:
    def __init__(self, *, auto_create: bool = True, template: QueueSettings | None = None,
                 default_group: str = ""):
        self.auto_create = auto_create
        self.template = template or QueueSettings(name="template")  # settings of auto-created queues
        self.default_group = default_group  # node-wide name of the default group of shared queues
        self.queues: dict[str, Queue] = {}
        self._consumer_queue: dict[object, Queue] = {}
        self.next_seq = 1
        self.declared: list[QueueSettings] = []  # declarations (auto-creates too) the adapter has not journalled yet

    # ---- queues ------------------------------------------------------------------------------

    def declare_queue(self, settings: QueueSettings, *, exist_ok: bool = False) -> Queue:
        settings.validate()
        existing = self.queues.get(settings.name)
        if existing is not None:
            if existing.settings == settings or exist_ok:
                return existing
            raise AlreadyExists(f"queue {settings.name!r} exists with other settings; delete it first")
        queue = Queue(settings, fallback_default_group=self.default_group)
        self.queues[settings.name] = queue
        self.declared.append(settings)
        return queue

    def queue(self, name: str, *, create: bool = False) -> Queue:
        queue = self.queues.get(name)
        if queue is None:
            if not (create and self.auto_create):
                raise NotFound(f"no queue {name!r} on this node (auto-create is "
                               f"{'on' if self.auto_create else 'off'}); declare it with 'grouper queue add'")
            settings = dataclasses.replace(self.template, name=name)
            if settings.dead_letter_queue == name:  # the template's own dead-letter queue
                settings = dataclasses.replace(settings, dead_letter_queue="")
            queue = self.declare_queue(settings)
        return queue

    def delete_queue(self, name: str) -> list:
        queue = self.queue(name)
        effects: list = []
        queue.close(effects)
        for effect in effects:
            if isinstance(effect, DetachConsumer):
                self._consumer_queue.pop(effect.consumer_id, None)
        del self.queues[name]
        return effects

    # ---- producers ---------------------------------------------------------------------------

    def enqueue(self, queue_name: str, message: Message, now_ms: int) -> list:
        created = queue_name not in self.queues
        queue = self.queue(queue_name, create=True)
        message.seq = self.next_seq
        message.enqueued_at_ms = message.enqueued_at_ms or now_ms
        effects: list = []
        try:
            queue.enqueue(message, now_ms, effects)  # raises before changing anything
        except GrouperError:
            if created:  # a refusal changes nothing, not even by auto-creating (nor journalling it)
                del self.queues[queue_name]
                self.declared = [s for s in self.declared if s is not queue.settings]
            raise
        self.next_seq += 1
        return effects

    def take_back(self, sends: list[tuple[str, Message]], now_ms: int) -> tuple[list[bool], list]:
        """Durable sends whose journal batch failed, as (queue name, message) in the order their
        producers waited: withdraw each one nothing has seen yet. Returns, in the same order, whether
        each had already been handed out (delivered, browsed, moved or dead-lettered) and so could not
        be taken back, and the effects to carry out. A send that is gone without being handed out
        (expired, purged, its queue deleted) counts as taken back: nobody will ever receive it."""
        handed_out: list[bool] = []
        effects: list = []
        for queue_name, message in sends:
            handed_out.append(message.handed_out)
            if message.handed_out or message.state != AVAILABLE:
                continue
            self.queues[queue_name].withdraw(message, now_ms, effects)  # available: its queue still exists
        return handed_out, effects

    def allocate_seq(self) -> int:
        """A seq for a message that leaves this node (forwarded): it orders the outbound channel."""
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def restore(self, queue_name: str, message: Message) -> None:
        """Journal recovery: put back a message with the seq it was stored with."""
        self.queues[queue_name].restore(message)
        self.next_seq = max(self.next_seq, message.seq + 1)

    # ---- consumers ---------------------------------------------------------------------------

    def attach_consumer(self, queue_name: str, consumer_id, browse: bool, now_ms: int,
                        unsettled_max: int = 0) -> list:
        if consumer_id in self._consumer_queue:
            raise AlreadyExists(f"consumer {consumer_id!r} is already attached")
        queue = self.queue(queue_name, create=True)
        effects: list = []
        queue.attach(consumer_id, browse, now_ms, effects, unsettled_max)
        self._consumer_queue[consumer_id] = queue
        return effects

    def detach_consumer(self, consumer_id, now_ms: int) -> list:
        queue = self._consumer_queue.pop(consumer_id, None)
        effects: list = []
        if queue is not None:
            dead = queue.detach(consumer_id, now_ms, effects)
            self._dead_letter(queue, dead, now_ms, effects)
        return effects

    def set_credit(self, consumer_id, credit: int, now_ms: int) -> list:
        effects: list = []
        queue = self._consumer_queue.get(consumer_id)
        if queue is not None:
            queue.set_credit(consumer_id, credit, now_ms, effects)
        return effects

    def settle(self, consumer_id, delivery_id: int, outcome: Outcome, now_ms: int,
               delivery_failed: bool = False) -> list:
        effects: list = []
        queue = self._consumer_queue.get(consumer_id)
        if queue is not None:
            dead = queue.settle(consumer_id, delivery_id, outcome, delivery_failed, now_ms, effects)
            self._dead_letter(queue, dead, now_ms, effects)
        return effects

    def _dead_letter(self, source: Queue, dead: list[Message], now_ms: int, effects: list) -> None:
        target_name = source.settings.dead_letter_queue
        if not dead or not target_name:
            return
        try:
            target = self.queue(target_name, create=True)
        except GrouperError as error:
            # The source has already removed them and dispatched on; raising now would lose these
            # effects. Discard them as if no dead-letter queue were set, and say why.
            for message in dead:
                effects.append(Dropped(source.settings.name, message.seq,
                                       f"dead-letter queue {target_name!r} unavailable: {error.description}"))
            return
        room: list[Message] = []
        room_bytes = 0
        for message in dead:
            try:
                target.check_capacity(room_bytes + message.size_bytes, len(room) + 1)
            except GrouperError as error:
                effects.append(Dropped(source.settings.name, message.seq,
                                       f"dead-letter queue {target_name!r} is full: {error.description}"))
            else:
                room.append(message)
                room_bytes += message.size_bytes
        self._transfer(source, target, room, now_ms, effects)

    def _transfer(self, source: Queue, target: Queue, messages: list[Message], now_ms: int,
                  effects: list) -> None:
        """Copy already-removed messages into `target`, journalling them before their removal."""
        stored: list = []
        seqs = {m.seq for m in messages}
        for old in messages:
            old.handed_out = True  # its copy lives on in `target`: a failed write cannot take it back
            message = Message(old.payload, old.group_id, expires_at_ms=old.expires_at_ms,
                              closes_group=old.closes_group, delivery_count=old.delivery_count,
                              enqueued_at_ms=old.enqueued_at_ms, seq=self.next_seq)
            self.next_seq += 1
            target.restore(message)
            target.enqueued_total += 1
            if target.settings.durable:
                stored.append(Stored(target.settings.name, message))
        first_removal = next((i for i, e in enumerate(effects)
                              if isinstance(e, Removed) and e.queue == source.settings.name
                              and e.seq in seqs), len(effects))
        effects[first_removal:first_removal] = stored
        target.tick(now_ms, effects)

    # ---- time --------------------------------------------------------------------------------

    def tick(self, now_ms: int) -> list:
        effects: list = []
        for queue in self.queues.values():
            queue.tick(now_ms, effects)
        return effects

    def next_deadline_ms(self) -> int | None:
        deadlines = [d for d in (q.next_deadline_ms() for q in self.queues.values()) if d is not None]
        return min(deadlines) if deadlines else None

    # ---- management --------------------------------------------------------------------------

    def list_queues(self) -> list[dict]:
        return [self.queues[name].stats() for name in sorted(self.queues)]

    def list_groups(self, queue_name: str) -> list[dict]:
        return self.queue(queue_name).group_rows()

    def reset_groups(self, queue_name: str, group: str | None, now_ms: int) -> tuple[int, list]:
        effects: list = []
        count = self.queue(queue_name).reset_groups(group, now_ms, effects)
        return count, effects

    def purge_group(self, queue_name: str, group: str, count: int | None, now_ms: int) -> tuple[int, list]:
        effects: list = []
        queue = self.queue(queue_name)
        taken = queue.take_group_messages(group, count, effects)
        queue.tick(now_ms, effects)
        return len(taken), effects

    def move_group(self, queue_name: str, group: str, destination: str, count: int | None,
                   now_ms: int) -> tuple[int, list]:
        source = self.queue(queue_name)
        target = self.queue(destination)
        if target is source:
            raise AlreadyExists(f"cannot move group {group!r} of {queue_name!r} onto itself")
        moving = source.group_head_messages(group, count)
        target.check_capacity(sum(m.size_bytes for m in moving), len(moving))  # refuse before touching anything
        effects: list = []
        taken = source.take_group_messages(group, count, effects)
        self._transfer(source, target, taken, now_ms, effects)
        source.tick(now_ms, effects)
        return len(taken), effects
