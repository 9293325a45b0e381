"""The node core: every queue of one node, its consumers, and the moves between queues.

Pure like the queues it owns: callers pass `now_ms` and carry out the returned effects in order.
Rules:
- `seq` is assigned here, node-wide and increasing, so queue order survives moves and recovery.
- Its collaborators, one noun each: moves between queues (moves.py: a message is `Stored` at its
  destination before it is `Removed` from its source), dead letters (dead_letters.py), subscriptions
  of multicast addresses (subscriptions.py), the node's paging (node_paging.py), the operators' calls
  (management.py). The per-message calls
  (enqueue, settle, set_credit, tick) stay here; the collaborators' public calls are bound here too, so
  callers name the broker alone.
- Consumer ids and delivery ids are opaque to the core; the adapter chooses consumer ids.
- A durable send whose journal write failed is taken back if no consumer, browser or other queue has
  it yet (`take_back`); otherwise it stays where it is: delivered already, it cannot be unsent, so its
  producer is told the outcome is unknown. Such a message is in no journal: settled, it is removed
  with a REMOVE record for a seq the journal never stored, which recovery and compaction ignore;
  released, it is delivered again from memory; a restart forgets it.
- Declarations are taken, never emptied by hand: `declarations()` drains them as effects. In a cluster
  (`local`, node/core/dispatch/local_changes.py) the queues made here on a client's behalf, the
  subscriptions ended here and the groups this node itself gave messages are recorded for the cluster
  to take; a node alone records nothing.
- De-duplication (dedup.py): `enqueue` branches on the `dedup` setting alone; a resend raises Duplicate.
"""

from __future__ import annotations

from node.core.dispatch.address_settings import AddressSettings, check_parameters
from node.core.dispatch.addresses import Addresses
from node.core.dispatch.cold import RecordBudget
from node.core.dispatch.dead_letters import DeadLetters
from node.core.dispatch.dedup import Dedup
from node.core.dispatch.local_changes import LocalChanges
from node.core.dispatch.management import Management
from node.core.dispatch.message import AVAILABLE, JOURNALLED, Message, Outcome
from node.core.dispatch.moves import Moves
from node.core.dispatch.node_paging import NodePaging
from node.core.dispatch.queue import Queue
from node.core.dispatch.settings import QueueSettings
from node.core.dispatch.subscriptions import Subscriptions
from node.core.effects import Declared, DetachConsumer, Enqueued
from node.core.errors import AlreadyExists, GrouperError, NotFound


class Broker:
    def __init__(self, *, auto_create: bool = True, template: QueueSettings | None = None,
                 default_group: str = "", dead_letter_stamp=None, address_settings: AddressSettings | None = None,
                 multicast_addresses: tuple = (), dedup_id_of=None):
        self.auto_create = auto_create
        self.addresses = Addresses(multicast_addresses)  # multicast addresses and their subscription queues
        # settings of auto-created queues: [[address-setting]] tables over the [template]
        self.address_settings = address_settings or AddressSettings((), template)
        self.template = self.address_settings.template
        self.default_group = default_group  # node-wide name of the default group of shared queues
        self.queues: dict[str, Queue] = {}
        self._consumer_queue: dict[object, Queue] = {}
        self.next_seq = 1
        # declarations (auto-creates too) not journalled yet: `declarations` takes them
        self.declared: list[QueueSettings] = []
        # (payload, original queue, reason) -> payload of the dead-letter copy; None: the payload as it was
        self.dead_letter_stamp = dead_letter_stamp
        # None: not recorded (a node alone); the cluster protocol gives one and takes from it (the header)
        self.local: LocalChanges | None = None
        self.temporary: set[str] = set()  # temporary subscriptions made here, alive (for one link each)
        # bytes of message bodies all durable queues together keep in memory; 0 = no node budget
        self.memory_max_bytes = 0
        # their messages' records kept in memory (node/core/dispatch/cold.py); max_bytes 0 = no budget
        self.records = RecordBudget()
        # the collaborators (see the header), their public calls bound here
        self.moves = Moves(self)
        self.dead_letters = DeadLetters(self, self.moves)
        self.move_group = self.moves.move_group
        subscriptions = self.subscriptions = Subscriptions(self)
        self.subscribe, self.unsubscribe, self.copies = (subscriptions.subscribe, subscriptions.unsubscribe,
                                                         subscriptions.copies)
        paging = self.paging = NodePaging(self)
        self.journalled, self.promote, self.page_out, self.page_in = (paging.journalled, paging.promote,
                                                                      paging.page_out, paging.page_in)
        self.dedup = Dedup(dedup_id_of)  # issue 31; dedup_id_of(payload) -> id or None (node.amqp.duplicate_ids)
        management = Management(self)
        self.list_queues, self.list_groups, self.reset_groups, self.purge_group = (
            management.list_queues, management.list_groups, management.reset_groups, management.purge_group)

    # ---- queues ------------------------------------------------------------------------------

    def declare_queue(self, settings: QueueSettings, *, exist_ok: bool = False) -> Queue:
        settings.validate()
        existing = self.queues.get(settings.name)
        if existing is not None:
            if existing.settings == settings or exist_ok:
                return existing
            raise AlreadyExists(f"queue {settings.name!r} exists with other settings; delete it first")
        if self.addresses.is_multicast(settings.name):
            raise AlreadyExists(f"{settings.name!r} is a multicast address: its messages go to its subscription "
                                f"queues; give the queue another name and address = {settings.name!r}")
        queue = Queue(settings, fallback_default_group=self.default_group, records=self.records)
        queue.dead_letter_refusal = lambda message: self.dead_letters.refusal(queue, message)
        self.queues[settings.name] = queue
        if settings.address:
            self.addresses.bind(settings.address, settings.name)
        self.declared.append(settings)
        return queue

    def declarations(self) -> list | tuple:
        """The declarations made since the last call, as the Declared effects of the durable ones (the
        others are not journalled): the node shell (node/core/shell.py) and the cluster protocol put them
        before the broker effects that follow, so a queue's record precedes its messages'."""
        if not self.declared:
            return ()
        declared, self.declared = self.declared, []
        return [Declared(settings.to_dict()) for settings in declared if settings.durable]

    def forget_declared(self, journalled: set) -> None:
        """Recovery: these declarations are in the journal already, so they are not journalled again."""
        self.declared = [settings for settings in self.declared if settings not in journalled]

    def make_queue(self, settings: QueueSettings, temporary: bool = False) -> Queue:
        """Declare a queue on a client's behalf (auto-created, or a subscription), recorded in a cluster."""
        queue = self.declare_queue(settings)
        if self.local is not None:
            self.local.made.append((settings, temporary))
        return queue

    def redefine_queue(self, settings: QueueSettings) -> None:
        """Give a live queue new settings that leave its groups as they are (the caller checked that
        only fields the queue reads at each use differ: handler/queue_definitions.py)."""
        settings.validate()
        self.queues[settings.name].settings = settings
        self.declared.append(settings)

    def queue(self, name: str, *, create: bool = False, parameters: dict | None = None) -> Queue:
        """The queue `name`, auto-created when allowed. `parameters` (an attach address's, as
        node.core.dispatch.address_settings.split_address reads them) shape a queue created here and must
        equal an existing queue's settings."""
        queue = self.queues.get(name)
        if queue is None:
            if self.addresses.is_multicast(name):
                raise NotFound(f"{name!r} is a multicast address, not a queue: consume one of its subscriptions "
                               f"as {name}::QUEUE, or attach with the 'topic' capability for one of your own")
            if not (create and self.auto_create):
                raise NotFound(f"no queue {name!r} on this node (auto-create is "
                               f"{'on' if self.auto_create else 'off'}); declare it with 'grouper queue add'")
            queue = self.make_queue(self.address_settings.settings_for(name, parameters))
        elif parameters:
            check_parameters(queue.settings, parameters)
        return queue

    def delete_queue(self, name: str, error: GrouperError | None = None) -> list:
        """`error`: why its consumers are detached, when not simply because it was deleted."""
        queue = self.queue(name)
        effects: list = []
        queue.close(effects)
        for index, effect in enumerate(effects):
            if isinstance(effect, DetachConsumer):
                self._consumer_queue.pop(effect.consumer_id, None)
                if error is not None:
                    effects[index] = DetachConsumer(effect.consumer_id, error)
        del self.queues[name]
        self.dedup.drop(name)
        self.temporary.discard(name)
        if queue.settings.address:
            self.addresses.unbind(queue.settings.address, name)
        return effects

    # ---- producers ---------------------------------------------------------------------------

    def enqueue(self, queue_name: str, message: Message, now_ms: int) -> list:
        created = queue_name not in self.queues
        queue = self.queue(queue_name, create=True)
        message.seq = self.next_seq
        message.enqueued_at_ms = message.enqueued_at_ms or now_ms
        effects: list = [Enqueued(queue_name, message)] if queue.settings.trace else []
        try:
            dedup_key = queue.settings.dedup and self.dedup.key(queue.settings, message.payload, now_ms, effects)
            queue.enqueue(message, now_ms, effects)  # raises before changing anything
        except GrouperError:
            if created:  # a refusal changes nothing, not even by auto-creating (nor journalling it)
                del self.queues[queue_name]
                self.declared = [s for s in self.declared if s is not queue.settings]
                if self.local is not None:
                    self.local.unmake(queue.settings)
            raise
        self.next_seq += 1
        if dedup_key:  # False (no dedup), None (no id) or the id
            self.dedup.mark(queue.settings, dedup_key, message, now_ms, effects)
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
            self.dedup.forget(self.queues[queue_name].settings, message, effects)  # its mark too (dedup.py)
        return handed_out, effects

    def allocate_seq(self) -> int:
        """A seq for a message that leaves this node (forwarded): it orders the outbound channel."""
        seq = self.next_seq
        self.next_seq += 1
        return seq

    def restore(self, queue_name: str, message: Message) -> None:
        """Journal recovery: put back a message with the seq it was stored with (its body, or only
        its record past the node's memory budget: node/core/dispatch/paging.py)."""
        queue = self.queues[queue_name]
        if message.payload is None and queue.pager is None:
            raise GrouperError(f"journal holds messages of queue {queue_name!r}, now declared non-durable, whose "
                               f"bodies are past message_memory_max_bytes; start with a budget that holds them "
                               f"(0 = no budget) or declare the queue durable again")
        message.flags |= JOURNALLED
        queue.restore(message)
        self.next_seq = max(self.next_seq, message.seq + 1)

    def restore_cold(self, queue_name: str, seqs, size_bytes: int) -> None:
        """Journal recovery of a durable queue's messages as a cold tail (node/core/dispatch/cold.py): its live
        seqs, ascending, their payloads `size_bytes` in all; read back whole when dispatch nears them."""
        queue = self.queues[queue_name]
        if queue.cold is None:
            raise GrouperError(f"journal holds messages of queue {queue_name!r}, now declared non-durable; "
                               f"declare it durable again to recover them")
        if seqs:
            queue.restore_cold(len(seqs), seqs[0] - 1, size_bytes)
            self.next_seq = max(self.next_seq, seqs[-1] + 1)

    # ---- consumers ---------------------------------------------------------------------------

    def attach_consumer(self, queue_name: str, consumer_id, browse: bool, now_ms: int,
                        unsettled_max: int = 0, selector=None) -> list:
        if consumer_id in self._consumer_queue:
            raise AlreadyExists(f"consumer {consumer_id!r} is already attached")
        queue = self.queue(queue_name, create=True)
        effects: list = []
        queue.attach(consumer_id, browse, now_ms, effects, unsettled_max, selector)
        self._consumer_queue[consumer_id] = queue
        return effects

    def detach_consumer(self, consumer_id, now_ms: int) -> list:
        queue = self._consumer_queue.pop(consumer_id, None)
        effects: list = []
        self.dead_letters.reserved.clear()
        if queue is not None:
            dead = queue.detach(consumer_id, now_ms, effects)
            if dead:
                self.dead_letters.send(queue, dead, now_ms, effects)
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
        dead_letters = self.dead_letters
        dead_letters.reserved.clear()
        if queue is not None:
            dead = queue.settle(consumer_id, delivery_id, outcome, delivery_failed, now_ms, effects)
            if dead:
                dead_letters.send(queue, dead, now_ms, effects)
        return effects

    def delivered_seq(self, consumer_id, delivery_id: int) -> int | None:
        """Seq of what `consumer_id` holds as `delivery_id`, None if nothing (issue 31: rollbacks go in seq order)."""
        queue = self._consumer_queue.get(consumer_id)
        return None if queue is None else queue.delivered_seq(consumer_id, delivery_id)

    # ---- time --------------------------------------------------------------------------------

    def tick(self, now_ms: int) -> list:
        effects: list = []
        lapsed: list = []
        for queue in self.queues.values():
            lapsed += queue.lapsed_leases(now_ms)  # first: a lapsed consumer takes nothing more
            queue.tick(now_ms, effects)
        for consumer_id, error in lapsed:  # group leases (queue_leases.py): the link learns why, then lets go
            effects.append(DetachConsumer(consumer_id, error))
            effects += self.detach_consumer(consumer_id, now_ms)
        return effects

    def next_deadline_ms(self) -> int | None:
        deadlines = [d for d in (q.next_deadline_ms() for q in self.queues.values()) if d is not None]
        return min(deadlines) if deadlines else None
