"""One simulated node: the real pure cores wired the way node/cluster.py wires them, over simulated I/O.

`SimNode` follows `ClusterLink` (node/cluster.py) method for method (arrive, _send, _reserve_seq,
quiesced, _flushed, _reservation_flushed, _forward_flushed, _reserved_again, acknowledged, applied,
ready, tick, _refresh_leases, _touch_failed, handle_forward, _enqueue_forwarded, recover_declaration,
recover_outbound) and the few `AmqpServer` and `runtime` pieces those call
(enqueue_local, accept_when_stored, refuse, apply, after_flush, journal_durable, journal_failed,
consumer_counts, the end of a batch of the engine loop, journal recovery). Each copy says which real function it
mirrors and keeps only what the simulation exercises. The Router, Outbound, Inbound and Broker are the
production classes. Only the I/O is modelled:
- `Store` is the journal: an append-only list of records; `flush` hands the records so far to the
  writer as one unit; after a seeded delay the writer takes every unit handed by then as one batch,
  and after another the engine loop hears it is durable and runs what waited for it (fn(None)). Units
  handed meanwhile go in the next batch, so one may be written after an earlier one failed. A write may fail (scripted, or config.journal_fail_rate): as node/store/journal.py
  promises, the failed batch's records are dropped, never written, and what waited for them hears
  fn(reason). A crash keeps the durable records and, with torn tails, any longer prefix of what had
  been handed to the writer (recovery trusts the file up to the first bad frame, not unit boundaries).
- `ForwarderModel` is `node/peer/forwarder.py` without threads: one call in flight, a batch of the
  oldest pending entries, drop up to the owner's high water on a reply, back off on failure or
  timeout, resend from the oldest.
- the raft member is the simulation's `RaftLog`; its feed arrives through `catch_up`.
Never imports proton, grpc, pysyncobj, threading or time.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from node.core.broker import Broker
from node.core.effects import Deliver, DetachConsumer, Dropped, Removed, Stored
from node.core.errors import GrouperError
from node.core.message import Message
from node.core.routing import Inbound, Outbound, Router
from node.core.settings import QueueSettings
from tests.sim.raft_log import MEMBERS, REFUSED, ROUTES, SNAPSHOT

# the journal names of node/cluster.py (importing it would import threading and gRPC)
OUTBOUND_PREFIX = "\x00out\x00"
MARK_PREFIX = "\x00mark\x00"
SEQ_RESERVATION = "\x00seq"
STORED = "stored"  # outcome of a journal batch written to disk
CLAIM_RETRY_INTERVAL_MS = 100  # node/cluster.py; a failed touch is retried 10 times this later
CONSUMER_REPORT_INTERVAL_MS = 5000
JOURNAL_RETRY_INTERVAL_MS = 1000  # node/amqp/loop.py: durable sends are refused this long after a failed write


class Entry(NamedTuple):  # node.peer.forwarder.Entry
    forward_seq: int
    queue: str
    group_id: str | None
    payload: bytes
    expires_at_ms: int
    closes_group: bool
    enqueued_at_ms: int


def outbound_name(owner: str, queue: str) -> str:
    return f"{OUTBOUND_PREFIX}{owner}\x00{queue}"


def parse_outbound_name(name: str) -> tuple[str, str]:
    owner, _, queue = name[len(OUTBOUND_PREFIX):].partition("\x00")
    return owner, queue


def mid_of(message_or_payload) -> str:
    payload = message_or_payload if isinstance(message_or_payload, bytes) else message_or_payload.payload
    return payload.decode()


# ---- the journal ---------------------------------------------------------------------------------

class Store:
    """Records: ("declare", name, values), ("store", name, seq, payload, group, enqueued_at_ms, origin),
    ("remove", name, seq). `origin` is (source, forward_seq) for a forwarded message; only the
    invariants read it."""

    def __init__(self):
        self.records: list[tuple] = []
        self.handed = 0  # records[:handed] were handed to the writer
        self.taken = 0  # records[:taken] were taken by the writer (durable <= taken <= handed)
        self.durable = 0  # records[:durable] are on disk
        self.waiters: deque = deque()  # (ticket, callback), tickets increasing

    def crash(self, keep: int) -> None:
        assert self.durable <= keep <= self.handed
        del self.records[keep:]
        self.handed = self.taken = self.durable = keep
        self.waiters.clear()

    def recovered(self) -> tuple[dict, dict]:
        """What recovery reads back: declarations by name, and live store records by name and seq."""
        declarations: dict[str, dict] = {}
        messages: dict[str, dict[int, tuple]] = {}
        for record in self.records:
            kind = record[0]
            if kind == "store":
                messages.setdefault(record[1], {})[record[2]] = record
            elif kind == "remove":
                messages.get(record[1], {}).pop(record[2], None)
            else:
                declarations[record[1]] = record[2]
                messages.setdefault(record[1], {})
        return declarations, messages


def _reserved_name(name: str) -> bool:
    return name.startswith("\x00")


# ---- forwarding ----------------------------------------------------------------------------------

class ForwarderModel:
    def __init__(self, node: "SimNode", owner: str):
        self.node = node
        self.sim = node.sim
        self.owner = owner
        self.pending: deque[Entry] = deque()
        self.last_submitted_seq = 0
        self.call: tuple[int, list[Entry]] | None = None
        self.high_water = 0
        self.retry_at_ms = 0
        self.retry_delay_ms = 0
        self.kick_due = False
        self.closed = False

    def submit(self, entries: list[Entry]) -> None:
        for entry in entries:
            if entry.forward_seq <= self.last_submitted_seq:
                self.sim.violation(f"{self.node.node_id}: forward_seq {entry.forward_seq} submitted to "
                                   f"{self.owner} after {self.last_submitted_seq}")
            self.last_submitted_seq = entry.forward_seq
        self.pending.extend(entries)
        self.kick()

    def kick(self) -> None:
        sim = self.sim
        if self.closed or self.call is not None or not self.pending:
            return
        if sim.now_ms < self.retry_at_ms:
            if not self.kick_due:
                self.kick_due = True
                sim.schedule(self.retry_at_ms - sim.now_ms, self._kick_after_backoff, None)
            return
        batch = list(self.pending)[:sim.config.batch_messages_max]
        number = sim.next_call_number()
        self.call = (number, batch)
        sim.network.forward(self, number, batch)
        sim.schedule(sim.config.call_timeout_ms, lambda: self.timed_out(number), None)

    def _kick_after_backoff(self) -> None:
        self.kick_due = False
        self.kick()

    def replied(self, number: int, high_water: int | None) -> None:
        if self.closed or self.call is None or self.call[0] != number:
            return  # the reply of a call given up on
        batch = self.call[1]
        self.call = None
        if high_water is None or high_water < batch[0].forward_seq:
            self.failed()
        else:
            self.acked(high_water)
        self.kick()

    def timed_out(self, number: int) -> None:
        if self.closed or self.call is None or self.call[0] != number:
            return
        self.call = None
        self.failed()
        self.kick()

    def acked(self, high_water: int) -> None:
        while self.pending and self.pending[0].forward_seq <= high_water:
            self.pending.popleft()
        self.retry_delay_ms = 0
        self.retry_at_ms = 0
        if high_water > self.high_water:
            self.high_water = high_water
            self.node.acknowledged(self.owner, high_water)

    def failed(self) -> None:
        config = self.sim.config
        self.retry_delay_ms = min(config.retry_max_ms, max(config.retry_min_ms, self.retry_delay_ms * 2))
        self.retry_at_ms = self.sim.now_ms + self.retry_delay_ms


# ---- the node ------------------------------------------------------------------------------------

class SimNode:
    def __init__(self, sim, node_id: str):
        self.sim = sim
        self.node_id = node_id
        self.store = Store()
        self.incarnation = 0
        self.alive = False
        # while down: what its journal holds, for the invariants
        self.down_holdings: set[tuple[str, str]] = set()  # route keys of groups in its queues
        self.down_outbound: list[tuple[tuple[str, str], str, int]] = []  # (route key, owner, forward seq)
        self.down_marks: dict[str, int] = {}  # source -> high-water forward seq its journal holds
        self.down_mids: list[str] = []
        self.journal_failing = False  # scripted: every write fails until cleared (the disk's, kept across restarts)

    # ---- lifecycle -----------------------------------------------------------------------------

    def boot(self, config_queues=()) -> None:
        """Start a new incarnation from the journal; `config_queues`: QueueSettings of the config file."""
        sim = self.sim
        self.incarnation += 1
        self.alive = True
        self.down_holdings, self.down_outbound, self.down_marks, self.down_mids = set(), [], {}, []
        self.broker = Broker()
        self.router = Router(self.node_id, sim.config.handler_timeout_ms, sim.config.group_timeout_ms // 2)
        self.outbound = Outbound()
        self.inbound = Inbound()
        self.members: dict = {}
        self.seq_reserved = 0
        self._unsubmitted: dict[str, list[Entry]] = {}  # this batch's new outbound entries, per owner
        self._recovered: dict[str, list[Entry]] = {}  # journalled before a restart: durable already
        self._inbound_durable: dict[str, int] = {}  # ClusterLink._inbound_durable
        self._reserved_durable = 0  # the highest seq reservation known to be on disk
        self._batch_reservation = 0  # the reservation journalled in the current batch, if any
        self._flushing: deque = deque()  # [batch, reservation, outcome], journal order
        self._reserving = False  # a reservation covering flushed batches is on its way to disk
        self._forwarders: dict[str, ForwarderModel] = {}
        self._retry_claims: list = []
        self._retry_due_ms = 0
        self._reported: dict | None = None
        self._report_due_ms = 0
        self._refresh_due_ms = 0
        self._awaiting_flush: list = []  # callbacks for when everything journalled so far is durable
        self._writer_due = False
        self.journal_stalled = False
        self._journal_failed: str | None = None  # AmqpServer._journal_failed
        self._journal_retry_at_ms = 0
        self.consumers: dict[str, object] = {}  # consumer id -> the simulation's consumer
        self.live: dict[tuple[str, int], str] = {}  # (queue, seq) -> message id held by the broker
        self._origin: dict[tuple[str, int], tuple[str, int]] = {}  # forwarded here: (queue, seq) -> origin
        # the replica: log entries applied so far, and when the next ones may be
        self.applied_index = 0
        self.apply_due_ms: dict[int, int] = {}
        self.replay_due_ms = sim.now_ms + sim.rng.randint(1, sim.config.replay_ms_max)
        self.ready_target = sim.raft.commit_index if sim.raft.leader_up else None
        self.recover(config_queues)
        self.apply([])  # journals the declarations made during recovery
        sim.schedule(self.replay_due_ms - sim.now_ms, self.guarded(self.catch_up), None)

    def crash(self, keep: int) -> None:
        self.alive = False
        for forwarder in self._forwarders.values():
            forwarder.closed = True
        self.store.crash(keep)
        declarations, messages = self.store.recovered()
        self.down_marks = {name[len(MARK_PREFIX):]: int(values["high_water"])
                           for name, values in declarations.items() if name.startswith(MARK_PREFIX)}
        for name, by_seq in messages.items():
            for record in by_seq.values():
                if _reserved_name(name):
                    owner, queue = parse_outbound_name(name)
                    self.down_outbound.append(((queue, record[4]), owner, record[2]))
                else:
                    self.down_holdings.add((name, record[4]))
                    self.down_mids.append(mid_of(record[3]))

    def taken_from(self, source: str) -> int:
        """The highest forward seq from `source` this node will skip as a resend (up or down)."""
        return self.inbound.high_water.get(source, 0) if self.alive else self.down_marks.get(source, 0)

    def guarded(self, fn):
        """`fn` for a later event: dropped if this incarnation has crashed meanwhile."""
        incarnation = self.incarnation

        def run(*args):
            if self.alive and self.incarnation == incarnation:
                fn(*args)
        return run

    # ---- recovery (runtime.recover, ClusterLink.recover_*) -----------------------------------

    def recover(self, config_queues=()) -> None:
        """Node.recover (node/runtime.py) with ClusterLink.recover_*."""
        declarations, messages = self.store.recovered()
        for settings in config_queues:
            self.broker.declare_queue(settings)
        journalled = set()
        for name, values in declarations.items():
            if _reserved_name(name):
                assert self.recover_declaration(values), name
                continue
            settings = QueueSettings.from_dict(values)
            journalled.add(settings)
            if settings.name not in self.broker.queues:
                self.broker.declare_queue(settings)
        self.broker.declared = [s for s in self.broker.declared if s not in journalled]
        outbound = {name: [self._message(record) for _, record in sorted(by_seq.items())]
                    for name, by_seq in messages.items() if _reserved_name(name)}
        if outbound:
            self.recover_outbound(outbound)
        for name, by_seq in messages.items():
            if _reserved_name(name):
                continue
            if name not in self.broker.queues:
                self.broker.queue(name, create=True)
            for seq in sorted(by_seq):
                self.broker.restore(name, self._message(by_seq[seq]))
                self.live[(name, seq)] = mid_of(by_seq[seq][3])

    @staticmethod
    def _message(record: tuple) -> Message:
        _, _, seq, payload, group, enqueued_at_ms, _ = record
        return Message(payload, group, enqueued_at_ms=enqueued_at_ms, seq=seq)

    def recover_declaration(self, values: dict) -> bool:
        name = values["name"]
        if name == SEQ_RESERVATION:
            self.seq_reserved = self._reserved_durable = int(values["reserved"])
            self.broker.next_seq = max(self.broker.next_seq, self.seq_reserved)
            return True
        if name.startswith(MARK_PREFIX):
            source, high_water = name[len(MARK_PREFIX):], int(values["high_water"])
            self.inbound.advance(source, high_water)
            self._inbound_durable[source] = high_water
            return True
        return False

    def recover_outbound(self, messages_by_name: dict) -> int:
        entries = []
        for name, messages in messages_by_name.items():
            owner, queue = parse_outbound_name(name)
            for message in messages:
                entries.append((message.seq, owner, queue, name, message))
        for seq, owner, queue, name, message in sorted(entries, key=lambda entry: entry[0]):
            self.broker.next_seq = max(self.broker.next_seq, seq + 1)
            known = self.broker.queues.get(queue)
            route_key = known.route_key(message.group_id) if known is not None else message.group_id
            self.outbound.add(owner, seq, (queue, route_key), name)
            self._recovered.setdefault(owner, []).append(_entry(queue, message))
        return len(entries)

    # ---- the journal (node/store/journal.py, as the engine loop uses it) -------------------------

    def journal_store(self, name: str, message: Message, origin=None) -> None:
        self.store.records.append(("store", name, message.seq, message.payload, message.group_id,
                                   message.enqueued_at_ms, origin))

    def journal_remove(self, name: str, seq: int) -> None:
        self.store.records.append(("remove", name, seq))

    def journal_declare(self, values: dict) -> None:
        self.store.records.append(("declare", values["name"], dict(values)))

    def end_of_batch(self) -> None:
        """AmqpServer._end_batch: cluster.quiesced(), then one journal unit."""
        store = self.store
        if not (self.router.to_claim or self._unsubmitted or self._recovered or self._awaiting_flush
                or store.handed != len(store.records)):
            return  # an empty batch: nothing to propose, forward, journal or confirm
        self.quiesced()
        store.handed = len(store.records)
        ticket = store.handed
        for callback in self._awaiting_flush:
            store.waiters.append((ticket, callback))
        self._awaiting_flush = []
        if store.durable < store.handed and not self._writer_due:
            self._writer_due = True
            self.sim.schedule(self.sim.rng.randint(0, self.sim.config.flush_ms_max),
                              self.guarded(self._write), None)
        elif store.waiters and store.waiters[0][0] <= store.durable:
            self._durable()

    def _write(self) -> None:
        """Journal._run: the writer takes every unit handed so far as one batch; the engine loop hears the
        outcome after a seeded delay, and units handed meanwhile go in the next batch (which may be
        written after this one failed)."""
        sim = self.sim
        if self.journal_stalled:  # a slow disk: try again later
            sim.schedule(1, self.guarded(self._write), None)
            return
        upto = self.store.taken = self.store.handed
        failed = self.journal_failing or bool(sim.config.journal_fail_rate and sim.faults_on
                                              and sim.rng.random() < sim.config.journal_fail_rate)
        sim.schedule(sim.rng.randint(1, sim.config.write_ms_max),
                     self.guarded(lambda: self._written(upto, failed)), None)

    def _written(self, upto: int, failed: bool) -> None:
        store = self.store
        self._writer_due = False
        if failed:
            self._write_failed(upto)
        else:
            store.durable = upto
            self._durable()
        if store.durable < store.handed:
            self._writer_due = True
            self.sim.schedule(self.sim.rng.randint(0, self.sim.config.flush_ms_max),
                              self.guarded(self._write), None)

    def _durable(self) -> None:
        """AmqpServer.journal_durable."""
        store = self.store
        self._journal_failed = None
        while store.waiters and store.waiters[0][0] <= store.durable:
            _, callback = store.waiters.popleft()
            callback(None)

    def _write_failed(self, upto: int) -> None:
        """Journal._fail_batch (its records are dropped, not retried), then AmqpServer.journal_failed for
        each of its tickets; later units stay handed, their tickets moved down past the dropped records."""
        store = self.store
        failed = upto - store.durable
        del store.records[store.durable:upto]
        store.handed -= failed
        store.taken = store.durable
        reason = "journal write failed (simulated)"
        self.sim.trace(f"  {self.node_id} journal write failed: {failed} records dropped")
        self.sim.stats["journal_failures"] += 1
        self._journal_failed = reason
        self._journal_retry_at_ms = self.sim.now_ms + JOURNAL_RETRY_INTERVAL_MS
        waiters, store.waiters = store.waiters, deque()
        for ticket, callback in waiters:
            if ticket > upto:
                store.waiters.append((ticket - failed, callback))
        for ticket, callback in waiters:
            if ticket <= upto:
                callback(reason)

    # ---- the server's side of the core -------------------------------------------------------

    def after_flush(self, callback) -> None:
        """callback(None) once everything journalled so far is durable, callback(reason) if it failed."""
        self._awaiting_flush.append(callback)

    def accept_when_stored(self, delivery, durable: bool, producer_settled: bool) -> None:
        assert durable and not producer_settled  # the simulation's producers wait for the outcome
        self.after_flush(lambda reason: self.sim.producer_outcome(
            delivery, None if reason is None else GrouperError(f"the node could not store the message: {reason}")))

    def refuse(self, delivery, error: GrouperError) -> None:
        self.sim.producer_outcome(delivery, error)

    def enqueue_local(self, delivery, queue_name: str, message: Message, durable: bool,
                      producer_settled: bool, now_ms: int) -> None:
        try:
            effects = self.broker.enqueue(queue_name, message, now_ms)
        except GrouperError as error:
            self.refuse(delivery, error)
        else:
            self.accept_when_stored(delivery, durable, producer_settled)
            self.apply(effects)

    def apply(self, effects: list) -> None:
        if self.broker.declared:
            declared, self.broker.declared = self.broker.declared, []
            for settings in declared:
                if settings.durable:
                    self.journal_declare(settings.to_dict())
        index = 0
        while index < len(effects):
            effect = effects[index]
            index += 1
            kind = type(effect)
            if kind is Deliver:
                self.sim.delivered(self, effect)
            elif kind is Stored:
                key = (effect.queue, effect.message.seq)
                self.journal_store(effect.queue, effect.message, self._origin.pop(key, None))
                self.live[key] = mid_of(effect.message)
            elif kind is Removed:
                self.journal_remove(effect.queue, effect.seq)
                self.live.pop((effect.queue, effect.seq), None)
            elif kind is DetachConsumer:
                self.consumers.pop(effect.consumer_id, None)
            elif kind is Dropped:
                self.sim.violation(f"{self.node_id} dropped message {effect.seq} of {effect.queue}: {effect.reason}")

    def consumer_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for consumer in self.consumers.values():
            counts[consumer.queue] = counts.get(consumer.queue, 0) + 1
        return counts

    def receive(self, delivery, queue_name: str, group: str, payload: bytes, now_ms: int) -> None:
        """AmqpServer._receive for a grouped message on a durable queue, in a cluster."""
        try:
            queue = self.broker.queue(queue_name, create=True)
            if self._journal_failed and now_ms < self._journal_retry_at_ms:
                raise GrouperError(f"the node cannot store messages right now ({self._journal_failed})")
            message = Message(payload, group)
            queue.check_group_id(message.group_id)
            route_key = queue.route_key(message.group_id)
            assert route_key is not None
            self.arrive(delivery, queue.settings.name, route_key, message, True, False, now_ms)
        except GrouperError as error:
            self.refuse(delivery, error)

    # ---- ClusterLink: arrivals ---------------------------------------------------------------

    def arrive(self, delivery, queue: str, route_key: str, message: Message, durable: bool,
               producer_settled: bool, now_ms: int) -> None:
        item = (delivery, queue, route_key, message, durable, producer_settled)
        owner = self.router.route((queue, route_key), item, now_ms)
        if owner is not None:
            self._send(owner, item, now_ms)

    def _send(self, owner: str, item, now_ms: int) -> None:
        delivery, queue, route_key, message, durable, producer_settled = item
        if owner == self.node_id:
            self.enqueue_local(delivery, queue, message, durable, producer_settled, now_ms)
            return
        message.seq = self.broker.allocate_seq()
        message.enqueued_at_ms = message.enqueued_at_ms or now_ms
        journal_name = None
        if durable:
            self._reserve_seq(message.seq)
            journal_name = outbound_name(owner, queue)
            self.journal_store(journal_name, message)
        self.outbound.add(owner, message.seq, (queue, route_key), journal_name)
        self._unsubmitted.setdefault(owner, []).append(_entry(queue, message))
        self.accept_when_stored(delivery, durable, producer_settled)

    def _reserve_seq(self, seq: int) -> None:
        if seq < self.seq_reserved:
            return
        self.seq_reserved = self._batch_reservation = seq + self.sim.config.seq_reserve_block
        self.journal_declare({"name": SEQ_RESERVATION, "reserved": self.seq_reserved})

    def _release(self, released, now_ms: int) -> None:
        for owner, item in released:
            self._send(owner, item, now_ms)

    # ---- ClusterLink: end of a batch of the engine loop -------------------------------------------------

    def quiesced(self) -> None:
        """ClusterLink.quiesced: recovered entries go to the forwarders at once (they are durable);
        new ones wait in journal order for their batch, and a seq reservation, to be on disk."""
        keys = self.router.take_claims()
        if keys:
            self._propose(keys, self.sim.now_ms)
        if self._recovered:
            recovered, self._recovered = self._recovered, {}
            for owner, entries in recovered.items():
                self._forwarder(owner).submit(entries)
        if self._unsubmitted:
            batch, self._unsubmitted = self._unsubmitted, {}
            reserved, self._batch_reservation = self._batch_reservation, 0
            flushing = [batch, reserved, None]
            self._flushing.append(flushing)
            self.after_flush(lambda reason: self._flushed(flushing, reason))

    def _flushed(self, flushing: list, reason) -> None:
        """ClusterLink._flushed."""
        flushing[2] = reason or STORED
        self._reservation_flushed(flushing[1], reason)

    def _reservation_flushed(self, reserved: int, reason) -> None:
        """ClusterLink._reservation_flushed."""
        if reason is None:
            self._reserved_durable = max(self._reserved_durable, reserved)
        else:
            self.seq_reserved = self._reserved_durable
        self._forward_flushed()

    def _forward_flushed(self) -> None:
        """ClusterLink._forward_flushed (no `closed` check: a crashed node's callbacks are dropped)."""
        while self._flushing:
            batch, _, outcome = self._flushing[0]
            if outcome is None:
                return
            if outcome is not STORED:
                for owner, entries in batch.items():
                    self.outbound.forget(owner, [entry.forward_seq for entry in entries])
                self.sim.stats["forwards_forgotten"] += sum(len(entries) for entries in batch.values())
            else:
                top_seq = max(entry.forward_seq for entries in batch.values() for entry in entries)
                if top_seq >= self._reserved_durable:
                    if not self._reserving:
                        self._reserving = True
                        self.sim.stats["reserved_again"] += 1
                        self.seq_reserved = self._reserved_durable
                        self._reserve_seq(self.broker.next_seq)  # ClusterLink: above every seq handed out so far
                        reserved, self._batch_reservation = self._batch_reservation, 0
                        self.after_flush(lambda reason: self._reserved_again(reserved, reason))
                    return
                for owner, entries in batch.items():
                    self._forwarder(owner).submit(entries)
            self._flushing.popleft()

    def _reserved_again(self, reserved: int, reason) -> None:
        """ClusterLink._reserved_again."""
        self._reserving = False
        self._reservation_flushed(reserved, reason)

    def _propose(self, keys: list, now_ms: int) -> None:
        on_failed = self.guarded(lambda reason: self._claim_failed(keys, reason))
        self.sim.raft.propose(("claim", tuple(keys), self.node_id, now_ms), on_failed)

    def _claim_failed(self, keys, reason: str) -> None:
        self._retry_claims.extend(keys)

    def _forwarder(self, owner: str) -> ForwarderModel:
        forwarder = self._forwarders.get(owner)
        if forwarder is None:
            forwarder = self._forwarders[owner] = ForwarderModel(self, owner)
        return forwarder

    def acknowledged(self, owner: str, high_water: int) -> None:
        for journal_name, seq in self.outbound.acknowledge(owner, high_water):
            self.journal_remove(journal_name, seq)

    # ---- ClusterLink: the handler's applied commands -----------------------------------------

    def catch_up(self) -> None:
        """The replica applies what the log committed and its lag allows, then maybe reports ready."""
        raft = self.sim.raft
        now_ms = self.sim.now_ms
        while self.applied_index < raft.commit_index:
            index = self.applied_index + 1
            if self.apply_due_ms.get(index, self.replay_due_ms) > now_ms:
                break
            self.apply_due_ms.pop(index, None)
            self.applied_index = index
            for kind, payload, at_ms in raft.feed(index):
                self.applied(kind, payload, at_ms)
        if not self.router.ready and self.ready_target is not None and self.applied_index >= self.ready_target:
            self.ready()

    def install_snapshot(self, index: int) -> None:
        """pysyncobj replaced the replica with the table as of `index` (a restart or a lagging member)."""
        self.applied_index = index
        self.apply_due_ms = {i: due for i, due in self.apply_due_ms.items() if i > index}
        self.applied(SNAPSHOT, self.sim.raft.routes_at(index), None)

    def applied(self, kind: str, payload, at_ms) -> None:
        """ClusterLink.applied: a route's lease runs from its refresh time in the log."""
        now_ms = self.sim.now_ms
        if kind == ROUTES:
            self._release(self.router.learn(payload, now_ms if at_ms is None else at_ms, now_ms), now_ms)
        elif kind == SNAPSHOT:
            fresh = {(queue, group) for queue, group, _, _ in payload}
            gone = [(queue, group, None) for queue, group in self.router.routes if (queue, group) not in fresh]
            released = self.router.learn(gone, now_ms)
            for queue, group, owner, touched_ms in payload:
                released += self.router.learn([(queue, group, owner)], touched_ms, now_ms)
            self._release(released, now_ms)
        elif kind == REFUSED:
            for key in payload:
                for item in self.router.give_up(tuple(key)):
                    self.refuse(item[0], GrouperError(f"routes_max reached for {key}"))
        elif kind == MEMBERS:
            self.members = payload

    def ready(self) -> None:
        now_ms = self.sim.now_ms
        self._release(self.router.become_ready(now_ms), now_ms)

    # ---- ClusterLink: timers -----------------------------------------------------------------

    def tick(self, now_ms: int) -> None:
        self.apply(self.broker.tick(now_ms))
        for item in self.router.expire(now_ms):
            self.refuse(item[0], GrouperError("no route decided within handler_timeout_ms"))
        if self._retry_claims and now_ms >= self._retry_due_ms:
            self.router.claim_failed(self._retry_claims)
            self._retry_claims = []
            self._retry_due_ms = now_ms + CLAIM_RETRY_INTERVAL_MS
        counts = self.consumer_counts()
        if counts != self._reported or now_ms >= self._report_due_ms:
            self.sim.raft.propose(("report_consumers", self.node_id, counts, now_ms))
            self._reported = counts
            self._report_due_ms = now_ms + CONSUMER_REPORT_INTERVAL_MS
        if self.router.lease_ms and now_ms >= self._refresh_due_ms:
            self._refresh_due_ms = now_ms + self.router.lease_ms // 2
            self._refresh_leases(now_ms)
        if self.router.to_claim:
            self.quiesced()

    def _refresh_leases(self, now_ms: int) -> None:
        """ClusterLink._refresh_leases (one command: the simulation never reaches CLAIM_KEYS_MAX)."""
        entries = {key: self.router.routes[key] for key in self.router.take_used() if key in self.router.routes}
        entries.update(self.outbound.owners_by_key())
        for name, queue in self.broker.queues.items():
            if queue.settings.grouping:
                entries.update(((name, key), self.node_id) for key in queue.busy_route_keys())
        if not entries:
            return
        touches = tuple((queue, group, node) for (queue, group), node in sorted(entries.items()))
        self.sim.raft.propose(("touch", touches, now_ms), self.guarded(self._touch_failed))

    def _touch_failed(self, reason: str) -> None:
        """ClusterLink._touch_failed and _refresh_soon: refresh again within CLAIM_RETRY_INTERVAL_MS * 10."""
        self._refresh_due_ms = min(self._refresh_due_ms, self.sim.now_ms + CLAIM_RETRY_INTERVAL_MS * 10)

    # ---- ClusterLink: the owner's side -------------------------------------------------------

    def handle_forward(self, source: str, entries: list[Entry], reply) -> None:
        """ClusterLink.handle_forward's engine loop part (`run`): enqueue, then reply once it is stored here;
        a failed write puts the source's high water back."""
        try:
            high_water = self._enqueue_forwarded(source, entries)
        except GrouperError:
            reply(None)
            return

        def stored(reason):
            if reason is None:
                self._inbound_durable[source] = max(self._inbound_durable.get(source, 0), high_water)
            else:
                self.inbound.high_water[source] = self._inbound_durable.get(source, 0)
            reply(high_water if reason is None else None)
        self.after_flush(stored)

    def _enqueue_forwarded(self, source: str, entries: list[Entry]) -> int:
        now_ms = self.sim.now_ms
        inbound = self.inbound
        advanced = False
        for entry in entries:
            if not inbound.fresh(source, entry.forward_seq):
                self.sim.stats["resends_skipped"] += 1
                continue
            message = Message(entry.payload, entry.group_id, expires_at_ms=entry.expires_at_ms,
                              closes_group=entry.closes_group, enqueued_at_ms=entry.enqueued_at_ms)
            try:
                effects = self.broker.enqueue(entry.queue, message, now_ms)
            except GrouperError:
                if not advanced:
                    raise
                break
            self._origin[(entry.queue, message.seq)] = (source, entry.forward_seq)
            inbound.advance(source, entry.forward_seq)
            advanced = True
            self.apply(effects)
        high_water = inbound.high_water.get(source, 0)
        if advanced:
            self.journal_declare({"name": MARK_PREFIX + source, "high_water": high_water})
        return high_water


def _entry(queue: str, message: Message) -> Entry:
    return Entry(message.seq, queue, message.group_id, bytes(message.payload), message.expires_at_ms or 0,
                 message.closes_group, message.enqueued_at_ms or 0)
