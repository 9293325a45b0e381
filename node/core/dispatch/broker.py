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
- Dead letters (rejected, or past `delivery_count_max`) go to the source's `dead_letter_queue_name`
  (`<queue>.DLQ` by default), created from the address settings when missing if the source's
  `dead_letter_queue_auto_create` allows. A queue auto-created under a `.DLQ` name is a dead-letter
  queue: unlimited deliveries and no dead-letter queue of its own, since an operator drains it.
- A dead letter is never dropped silently: when no dead-letter queue can take it (none may be
  created, or it is full), an over-delivered message stays in its queue (`Kept`) and a rejected one
  is dropped with a `Dropped` saying why (its consumer refused it for good).
- A queue whose settings name an `address` is one of that multicast address's subscriptions
  (node/core/dispatch/addresses.py); a multicast address is never auto-created as a queue of its name.
- A dead letter keeps its group id and delivery count; `dead_letter_stamp` (the adapter's codec)
  may rewrite its payload to record the original queue and the reason.
- In a cluster (`made` and `ended` are lists: the cluster protocol turns recording on) every queue
  made here on a client's behalf (auto-created by an attach, a send or a dead letter; a subscription
  an attach made) is recorded in `made`, and every subscription queue deleted here because its link
  ended (`unsubscribe`) in `ended`, for the cluster to define or delete on every node
  (node/core/cluster/definitions.py). Likewise `entered` records the (queue, route key) of every group
  this node itself put messages in (an admin move, a dead letter): those came by no route, and the
  cluster gives their group one. A node alone records nothing.
"""

from __future__ import annotations

import dataclasses

from node.core.dispatch.address_settings import AddressSettings, check_parameters
from node.core.dispatch.addresses import Addresses
from node.core.dispatch.cold import RecordBudget
from node.core.effects import DeadLettered, Declared, DetachConsumer, Enqueued, Removed, Stored
from node.core.errors import AlreadyExists, GrouperError, NotFound
from node.core.dispatch.message import AVAILABLE, COLD, JOURNALLED, Message, Outcome
from node.core.dispatch.queue import Queue
from node.core.dispatch.settings import QueueSettings


class Broker:
    def __init__(self, *, auto_create: bool = True, template: QueueSettings | None = None,
                 default_group: str = "", dead_letter_stamp=None, address_settings: AddressSettings | None = None,
                 multicast_addresses: tuple = ()):
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
        self._dead_letter_reserved: dict[str, tuple[int, int]] = {}  # DLQ -> (messages, bytes) promised this call
        # None: not recorded (a node alone); lists when a cluster takes them (see the header)
        self.made: list[tuple[QueueSettings, bool]] | None = None  # (settings, temporary subscription)
        self.ended: list[str] | None = None  # subscription queues deleted here as their link ended
        self.entered: set[tuple[str, str]] | None = None  # (queue, route key) given messages by this node itself
        self.temporary: set[str] = set()  # temporary subscriptions made here, alive (for one link each)
        # bytes of message bodies all durable queues together keep in memory; 0 = no node budget
        self.memory_max_bytes = 0
        # their messages' records kept in memory (node/core/dispatch/cold.py); max_bytes 0 = no budget
        self.records = RecordBudget()

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
        queue.dead_letter_refusal = lambda message: self._dead_letter_refusal(queue, message)
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

    def subscribe(self, address: str, name: str, *, durable: bool | None = None) -> Queue:
        """Create subscription queue `name` of multicast `address` (an attach's): it takes the settings
        the address settings give the address, as Artemis's address-setting match names addresses.
        `durable` None: as those settings say; False: a temporary subscription, for one link only."""
        if name in self.queues:
            raise AlreadyExists(f"queue {name!r} exists; subscribe through {address}::{name} only if it is "
                                f"bound to {address!r}")
        self.addresses.declare(address)
        settings = self._auto_settings(address)
        changes = {"name": name, "address": address}
        if durable is not None:
            changes["durable"] = durable
        queue = self._auto_create(dataclasses.replace(settings, **changes), temporary=durable is False)
        if durable is False:
            self.temporary.add(name)
        return queue

    def _auto_create(self, settings: QueueSettings, temporary: bool = False) -> Queue:
        queue = self.declare_queue(settings)
        if self.made is not None:
            self.made.append((settings, temporary))
        return queue

    def unsubscribe(self, name: str) -> list:
        """Delete subscription queue `name` because the link that made or resumed it ended (a temporary
        one detached, a durable one closed): in a cluster it ends on every node (see the header)."""
        effects = self.delete_queue(name)
        if self.ended is not None:
            self.ended.append(name)
        return effects

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
            queue = self._auto_create(self._auto_settings(name, parameters))
        elif parameters:
            check_parameters(queue.settings, parameters)
        return queue

    def _auto_settings(self, name: str, parameters: dict | None = None) -> QueueSettings:
        return self.address_settings.settings_for(name, parameters)

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
            queue.enqueue(message, now_ms, effects)  # raises before changing anything
        except GrouperError:
            if created:  # a refusal changes nothing, not even by auto-creating (nor journalling it)
                del self.queues[queue_name]
                self.declared = [s for s in self.declared if s is not queue.settings]
                if self.made:
                    self.made = [made for made in self.made if made[0] is not queue.settings]
            raise
        self.next_seq += 1
        return effects

    def copies(self, address: str, size_bytes: int, read) -> list:
        """(queue, what `read(group_header)` made of the message for it) for each subscription queue a
        send to multicast `address` is copied to, in name order; `read` is called once per group header.
        Raises, changing nothing, when any copy would be refused, so a send is copied everywhere or
        nowhere on this node."""
        read_for: dict = {}
        copies = []
        for name in self.addresses.subscriptions(address):
            queue = self.queues[name]
            header = queue.settings.group_header
            if header not in read_for:
                read_for[header] = read(header)
            arrival = read_for[header]
            queue.check_enqueue(arrival.group_id, size_bytes)
            copies.append((queue, arrival))
        return copies

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
        self._dead_letter_reserved.clear()
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
        self._dead_letter_reserved.clear()
        if queue is not None:
            dead = queue.settle(consumer_id, delivery_id, outcome, delivery_failed, now_ms, effects)
            self._dead_letter(queue, dead, now_ms, effects)
        return effects

    def _dead_letter_refusal(self, source: Queue, message: Message) -> str | None:
        """None when `message` of `source` can be dead-lettered now (creating the dead-letter queue if
        allowed, and reserving room in it); else why not, for a log line."""
        name = source.settings.dead_letter_queue_name
        if name == source.settings.name:
            return "a queue cannot be its own dead-letter queue"
        target = self.queues.get(name)
        if target is None:
            if not source.settings.dead_letter_queue_auto_create:
                return (f"dead-letter queue {name!r} does not exist and dead_letter_queue_auto_create is off "
                        f"for {source.settings.name!r}; declare it with 'grouper queue add {name}'")
            try:
                target = self._auto_create(self._auto_settings(name))
            except GrouperError as error:
                return f"dead-letter queue {name!r} cannot be created: {error.description}"
        count, size_bytes = self._dead_letter_reserved.get(name, (0, 0))
        try:
            target.check_capacity(size_bytes + message.size_bytes, count + 1)
        except GrouperError as error:
            return f"dead-letter queue {name!r} is full: {error.description}"
        self._dead_letter_reserved[name] = (count + 1, size_bytes + message.size_bytes)
        return None

    def _dead_letter(self, source: Queue, dead: list[tuple[Message, str]], now_ms: int, effects: list) -> None:
        if not dead:
            return
        target = self.queues[source.settings.dead_letter_queue_name]  # created by _dead_letter_refusal
        copies = self._transfer(source, target, [message for message, _ in dead], now_ms, effects,
                                [reason for _, reason in dead])
        for (message, reason), copy in zip(dead, copies):
            effects.append(DeadLettered(source.settings.name, message.seq, target.settings.name, copy.seq, reason))

    def _transfer(self, source: Queue, target: Queue, messages: list[Message], now_ms: int,
                  effects: list, dead_letter_reasons: list[str] | None = None) -> list[Message]:
        """Copy already-removed messages into `target`, journalling them before their removal.
        With `dead_letter_reasons` the copies are dead letters, stamped (`dead_letter_stamp`) with why."""
        stored: list = []
        copies: list[Message] = []
        seqs = {m.seq for m in messages}
        stamp = self.dead_letter_stamp if dead_letter_reasons is not None else None
        for index, old in enumerate(messages):
            old.handed_out = True  # its copy lives on in `target`: a failed write cannot take it back
            payload = old.payload
            if stamp is not None:
                payload = stamp(payload, source.settings.name, dead_letter_reasons[index])
            message = Message(payload, old.group_id, expires_at_ms=old.expires_at_ms,
                              closes_group=old.closes_group, delivery_count=old.delivery_count,
                              enqueued_at_ms=old.enqueued_at_ms, seq=self.next_seq)
            self.next_seq += 1
            target.restore(message)
            copies.append(message)
            if self.entered is not None:
                route_key = target.route_key(message.group_id)
                if route_key is not None:
                    self.entered.add((target.settings.name, route_key))
            target.enqueued_total += 1
            if target.settings.durable:
                stored.append(Stored(target.settings.name, message))
        first_removal = next((i for i, e in enumerate(effects)
                              if isinstance(e, Removed) and e.queue == source.settings.name
                              and e.seq in seqs), len(effects))
        effects[first_removal:first_removal] = stored
        target.tick(now_ms, effects)
        return copies

    # ---- paging (node/core/dispatch/paging.py) --------------------------------------------------------

    def journalled(self, stores: list, now_ms: int) -> list:
        """The journal reported these (queue name, message) STOREs on disk: their bodies may be paged
        out now. Pages out what is over the queues' budgets and the node's (`memory_max_bytes`)."""
        cold_queues = set()
        for queue_name, message in stores:
            message.flags |= JOURNALLED
            if message.flags & COLD:
                cold_queues.add(queue_name)
        effects: list = []
        for queue_name in sorted(cold_queues):
            queue = self.queues.get(queue_name)
            if queue is not None:
                queue.cold_journalled(now_ms, effects)
        return effects + self.page_out(now_ms)

    def promote(self, queue_name: str, records: dict, now_ms: int) -> list:
        """Records of a cold tail the journal read back (seq -> Message or None): node/core/dispatch/cold.py."""
        effects: list = []
        queue = self.queues.get(queue_name)
        if queue is not None:  # deleted meanwhile: nothing waits for them
            queue.promote(records, now_ms, effects)
        return effects + self.page_out(now_ms)

    def page_out(self, now_ms: int) -> list:
        effects: list = []
        total_bytes = 0
        for queue in self.queues.values():
            if queue.pager is None:
                continue
            budget_bytes = queue.settings.memory_max_bytes
            if budget_bytes and queue.pager.pageable_bytes > budget_bytes:
                queue.page_out(budget_bytes)
            total_bytes += queue.pager.pageable_bytes
        excess_bytes = total_bytes - self.memory_max_bytes
        if self.memory_max_bytes and excess_bytes > 0:
            # the node's budget: from the queues holding the most first, as little from each as will do
            for queue in sorted((q for q in self.queues.values() if q.pager is not None),
                                key=lambda q: (-q.pager.pageable_bytes, q.settings.name)):
                excess_bytes -= queue.page_out(max(0, queue.pager.pageable_bytes - excess_bytes))
                if excess_bytes <= 0:
                    break
        return effects

    def page_in(self, queue_name: str, bodies: dict, now_ms: int) -> list:
        """Bodies the journal read back for `queue_name` (seq -> payload): dispatch goes on with them."""
        effects: list = []
        queue = self.queues.get(queue_name)
        if queue is not None:  # deleted meanwhile: nothing waits for them
            queue.page_in(bodies, now_ms, effects)
        return effects

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
        queue.cold_refusal(f"purging group {group!r}")
        taken = queue.take_group_messages(group, count, effects, bodies=False)  # a purge needs no bodies
        queue.tick(now_ms, effects)
        return len(taken), effects

    def move_group(self, queue_name: str, group: str, destination: str, count: int | None,
                   now_ms: int) -> tuple[int, list]:
        source = self.queue(queue_name)
        target = self.queue(destination)
        if target is source:
            raise AlreadyExists(f"cannot move group {group!r} of {queue_name!r} onto itself")
        source.cold_refusal(f"moving group {group!r}")
        moving = source.group_head_messages(group, count)
        target.check_capacity(sum(m.size_bytes for m in moving), len(moving))  # refuse before touching anything
        effects: list = []
        taken = source.take_group_messages(group, count, effects)
        self._transfer(source, target, taken, now_ms, effects)
        source.tick(now_ms, effects)
        return len(taken), effects
