"""Forwarding: this node's outbound channels to other owners, their bounds, forward seq reservations,
the batches on their way to disk, and the owners' acknowledgements.

Rules:
- The outbound store is the journal: each forwarded message is a STORE under a reserved name
  (OUTBOUND_PREFIX owner NUL queue, node/core/cluster/outbound.py) until its owner acknowledges it, then a REMOVE.
- The store is bounded in payload bytes per owner (`outbound_max_bytes`) and for all owners together
  (`outbound_total_max_bytes`), and in messages per owner (`outbound_max_messages`: each keeps a record
  in memory even with its body paged); 0 = no bound. A producer's message for another owner is refused
  (ResourceLimitExceeded, naming the owner and the bound with its unit) when the bytes held plus its own
  would pass a byte bound, or the channel holds its message bound; an empty channel (an empty store,
  for the node-wide bound) takes any message, so one larger than a bound is not refused forever. Once a
  channel refused a message it refuses every one, whatever its size, until its owner acknowledges some
  of its backlog (the node-wide bound: until any owner does), so a later, smaller message of a group
  never slips in past a refused one while the owner is away. The refusal comes before the message is
  stored: nothing accepted is dropped.
- An operator's reroute (node/core/dispatch/reroute.py) obeys the bounds as sends do, with the copies its batch
  already promised (`reroute_owner`). What else fills a channel (a handover, a relay, recovery) counts
  toward the bytes but may pass the bound: it moves messages accepted already. Bodies page past
  `outbound_memory_max_bytes` per owner (node/core/cluster/outbound.py).
- Forward seqs are node seqs and must never repeat after a restart, or an owner would take new messages
  for resends: blocks of seqs are reserved in the journal (SEQ_RESERVATION) before use, and a batch is
  forwarded only once it, and a reservation covering its seqs, are on disk; batches leave in journal
  order. A failed batch's producers were refused: its entries never reach their owners.
- Imports only context.py of this package: the handover and the owner side call in, never the reverse.
"""

from __future__ import annotations

import collections
import logging

from node.core.cluster.context import SEQ_RESERVATION, STORED, Context, MustAgree
from node.core.effects import AcceptWhenStored, AfterFlush, Declared, Refuse, Removed, Stored
from node.core.errors import ResourceLimitExceeded
from node.core.dispatch.message import Message
from node.core.cluster.outbound import Outbound, entry_of, parse_outbound_name

log = logging.getLogger("grouper.cluster")

SEQ_RESERVE_BLOCK = 1 << 20  # seqs reserved per journal record


class BatchFlushing:
    """One batch of new outbound entries on its way to disk; `outcome` None until the journal says."""

    __slots__ = ("forwarding", "batch", "reserved", "outcome")

    def __init__(self, forwarding: Forwarding, batch: dict, reserved: int):
        self.forwarding = forwarding
        self.batch = batch  # owner -> [Entry]
        self.reserved = reserved  # the seq reservation journalled in the same batch, 0 if none
        self.outcome: str | None = None  # STORED or the failure's reason

    def flushed(self, reason: str | None, now_ms: int, effects: list) -> None:
        self.outcome = reason or STORED
        self.forwarding.reservation_flushed(self.reserved, reason, effects)


class ReservationFlushing:
    """A seq reservation journalled again on its own, after a failed batch took the one before."""

    __slots__ = ("forwarding", "reserved")

    def __init__(self, forwarding: Forwarding, reserved: int):
        self.forwarding = forwarding
        self.reserved = reserved

    def flushed(self, reason: str | None, now_ms: int, effects: list) -> None:
        self.forwarding.reserving = False
        self.forwarding.reservation_flushed(self.reserved, reason, effects)


class Forwarding:
    def __init__(self, context: Context, *, seq_reserve_block: int = SEQ_RESERVE_BLOCK, outbound_max_bytes: int = 0,
                 outbound_total_max_bytes: int = 0, outbound_max_messages: int = 0,
                 outbound_memory_max_bytes: int = 0):
        self.context = context
        self.broker = context.broker
        self.node_id = context.node_id
        self.journalled = context.journalled
        self.seq_reserve_block = seq_reserve_block
        self.outbound = Outbound(outbound_memory_max_bytes, context.counts)
        self.outbound_max_bytes = outbound_max_bytes
        self.outbound_total_max_bytes = outbound_total_max_bytes
        self.outbound_max_messages = outbound_max_messages
        self.outbound_refused: collections.Counter = collections.Counter()  # owner -> sends refused at the bound
        # owner -> the messages and bytes of a reroute batch's copies for it: [messages, bytes]
        self.rerouting: dict[str, list[int]] = {}
        # owners whose channel refused a send, None for the node-wide bound: every send is refused until
        # some of the backlog leaves (see the header)
        self.full: set[str | None] = set()
        self.seq_reserved = 0
        self.reserved_durable = 0  # the highest seq reservation known to be on disk
        self.batch_reservation = 0  # the reservation journalled in the current batch, if any
        self.unsubmitted: dict[str, list] = {}  # this batch's new outbound entries, per owner
        self.recovered: list = []  # SubmitForwards of what was journalled before a restart: durable already
        self.flushing: collections.deque[BatchFlushing] = collections.deque()  # journal order
        self.reserving = False  # a reservation covering flushed batches is on its way to disk
        self.recovered_top: dict[str, int] = {}  # owner -> the highest forward seq recovered for it

    # ---- into the store ------------------------------------------------------------------------

    def refusal(self, owner: str, size_bytes: int, promised: dict | None = None,
                then: str = "the message was not enqueued; send it again") -> ResourceLimitExceeded | None:
        """Why a message of `size_bytes` for `owner` may not enter the outbound store, or None;
        `promised`: owner -> [messages, bytes] on their way into the channels too (a reroute batch's);
        `then`: what happened and what to do, for the refusal's text."""
        outbound = self.outbound
        promised_messages, promised_bytes = promised.get(owner, (0, 0)) if promised else (0, 0)
        held_bytes = outbound.depth_bytes.get(owner, 0) + promised_bytes
        held_messages = len(outbound.channels.get(owner, ())) + promised_messages
        total_bytes = outbound.total_bytes + (sum(both[1] for both in promised.values()) if promised else 0)
        full = self.full
        if self.outbound_max_bytes and held_bytes and (
                owner in full or held_bytes + size_bytes > self.outbound_max_bytes):
            full.add(owner)
            limit = f"outbound_max_bytes = {self.outbound_max_bytes} bytes per owner"
        elif self.outbound_max_messages and (owner in full or held_messages >= self.outbound_max_messages):
            full.add(owner)  # each message keeps a record in memory, paged or not (node/core/cluster/outbound.py)
            limit = f"outbound_max_messages = {self.outbound_max_messages} messages per owner"
        elif self.outbound_total_max_bytes and total_bytes and (
                None in full or total_bytes + size_bytes > self.outbound_total_max_bytes):
            full.add(None)
            limit = (f"outbound_total_max_bytes = {self.outbound_total_max_bytes} bytes for all owners together, "
                     f"which hold {total_bytes} bytes")
        else:
            return None
        return ResourceLimitExceeded(
            f"owner node {owner} has not taken the {held_bytes} bytes node {self.node_id} holds for it in its "
            f"outbound store, which is full at {limit} (this message is {size_bytes} bytes; once full, the store "
            f"takes none until {owner} takes some): is {owner} down or unreachable? So {then} once {owner} takes "
            f"its backlog (grouper cluster status shows it), or raise the limit")

    def send(self, owner: str, item: tuple, now_ms: int, effects: list) -> None:
        """A producer's message for `owner`: refused at a bound, else into its channel and accepted once stored."""
        incoming, queue, route_key, message, durable, producer_settled = item
        refusal = self.refusal(owner, message.size_bytes)
        if refusal is not None:
            self.outbound_refused[owner] += 1
            self.context.counts["outbound_refused"] += 1
            effects.append(Refuse(incoming, refusal))
            return
        self.forward(owner, queue, route_key, message, durable, now_ms, effects)
        effects.append(AcceptWhenStored(incoming, durable, producer_settled))

    def forward(self, owner: str, queue: str, route_key: str, message: Message, durable: bool,
                now_ms: int, effects: list, origin: tuple | None = None) -> None:
        """Into the outbound channel of `owner`, with a new forward seq; `origin` of a relayed one."""
        message.seq = self.broker.allocate_seq()
        message.enqueued_at_ms = message.enqueued_at_ms or now_ms
        journal_name = None
        if durable and self.journalled:
            self.reserve_seq(message.seq, effects)
            journal_name = self.outbound.journal_name(owner, queue)
            effects.append(Stored(journal_name, message, origin))
        self.outbound.add(owner, message.seq, (queue, route_key), journal_name, message.size_bytes)
        self.unsubmitted.setdefault(owner, []).append(entry_of(queue, message))

    def reserve_seq(self, seq: int, effects: list) -> None:
        if seq < self.seq_reserved:
            return
        self.seq_reserved = self.batch_reservation = seq + self.seq_reserve_block
        effects.append(Declared({"name": SEQ_RESERVATION, "reserved": self.seq_reserved}))

    def batch_end(self, effects: list) -> None:
        """The engine loop's batch ended: what recovery put back is submitted, and this batch's new
        entries wait for the journal (BatchFlushing)."""
        if self.recovered:
            effects.extend(self.recovered)
            self.recovered = []
        if self.unsubmitted:
            # only this batch's own reservation is proven on disk when the batch is
            batch, self.unsubmitted = self.unsubmitted, {}
            reserved, self.batch_reservation = self.batch_reservation, 0
            flushing = BatchFlushing(self, batch, reserved)
            self.flushing.append(flushing)
            effects.append(AfterFlush(flushing))

    # ---- the journal's answers -------------------------------------------------------------------

    def reservation_flushed(self, reserved: int, reason, effects: list) -> None:
        if reason is None:
            self.reserved_durable = max(self.reserved_durable, reserved)
        else:  # the reservation may be lost with the batch: the next outbound message journals one
            self.seq_reserved = self.reserved_durable
        self._submit_flushed(effects)

    def _submit_flushed(self, effects: list) -> None:
        context = self.context
        while self.flushing and not context.closed:
            flushing = self.flushing[0]
            if flushing.outcome is None:
                return  # not on disk yet; later batches wait behind it
            if flushing.outcome is not STORED:
                # the producers were refused: these messages must not reach their owners
                for owner, entries in flushing.batch.items():
                    self.outbound.forget(owner, [entry.forward_seq for entry in entries])
                    self.drained(owner)
                context.counts["forwards_forgotten"] += sum(len(entries) for entries in flushing.batch.values())
            else:
                top_seq = max(entry.forward_seq for entries in flushing.batch.values() for entry in entries)
                if top_seq >= self.reserved_durable:
                    # a failed batch took the reservation these seqs were given under: reserve again
                    if not self.reserving:
                        self.reserving = True
                        context.counts["reserved_again"] += 1
                        self.seq_reserved = self.reserved_durable
                        self.reserve_seq(self.broker.next_seq, effects)  # above every seq handed out so far
                        reserved, self.batch_reservation = self.batch_reservation, 0
                        effects.append(AfterFlush(ReservationFlushing(self, reserved)))
                    return
                for owner, entries in flushing.batch.items():
                    self.outbound.ready(owner, entries, effects)
            self.flushing.popleft()

    # ---- the owners' answers ---------------------------------------------------------------------

    def acknowledged(self, owner: str, high_water: int) -> list:
        """`owner` holds (stored) everything this node forwarded it up to `high_water`."""
        waiting = len(self.outbound.channels.get(owner, ()))
        effects: list = []
        journalled = self.outbound.acknowledge(owner, high_water, effects)
        if len(self.outbound.channels.get(owner, ())) < waiting:
            self.drained(owner)
        if self.journalled:
            effects.extend(Removed(journal_name, seq) for journal_name, seq in journalled)
        return effects

    def outbound_read(self, name: str, records: dict) -> list:
        """The journal read back paged entries of outbound channel `name` (seq -> Message, None if it
        has none): submitted in order once the whole read is back (node/core/cluster/outbound.py)."""
        effects: list = []
        outbound = self.outbound
        outbound.read_back(name, records, effects)
        if outbound.lost:
            lost, outbound.lost = outbound.lost, []
            for journal_name, seq in lost:
                owner, queue = parse_outbound_name(journal_name)
                log.error("message %d of queue %r waiting for owner node %s is gone from the journal (damaged?): "
                          "it cannot be forwarded and is dropped", seq, queue, owner)
                self.drained(owner)
            self.context.counts["forwards_lost"] += len(lost)
        return effects

    def drained(self, owner: str) -> None:
        """Some of `owner`'s channel left the store: its sends, and any the node-wide bound refused, are
        weighed again."""
        self.full.discard(owner)
        self.full.discard(None)

    # ---- an operator's reroute (node/core/dispatch/reroute.py) --------------------------------------------

    def promise(self, owner: str, size_bytes: int) -> None:
        """A reroute batch's copy of `size_bytes` for `owner`: weighed as in the channel already."""
        refusal = self.refusal(owner, size_bytes, self.rerouting,
                               then="the reroute stops here, the rest left in its queue; run it again")
        if refusal is not None:
            raise refusal
        promised = self.rerouting.setdefault(owner, [0, 0])
        promised[0] += 1
        promised[1] += size_bytes

    def rerouted(self, broker_effects: list, forwards: list, now_ms: int) -> list:
        """A reroute batch: each copy for another node into its outbound channel (a STORE, as a
        handover's) before the source's REMOVEs; a failed write stops the node, as a handover's does."""
        self.rerouting.clear()  # what reroute_owner promised is in the channels now
        effects: list = []
        for forward in forwards:
            self.forward(forward.owner, forward.queue, forward.route_key, forward.message, forward.durable,
                         now_ms, effects)
        self.context.broker_effects(broker_effects, effects)
        if forwards:
            effects.append(AfterFlush(MustAgree(
                self.context, f"rerouting {len(forwards)} messages to their groups' owners")))
        return effects
