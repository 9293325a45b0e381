"""One simulated node: the node's own cores, ClusterProtocol, Broker and LeaderDuties' feed, over simulated I/O.

`SimNode` drives the node's own `NodeShell` (node/core/shell.py: the commit cycle, with the production
`Broker`, `Durability` and `ClusterProtocol` inside) as the engine loop and node/cluster.py do, and
carries out the shell's effects with one table of simulated I/O (AmqpServer.execute); it keeps the
engine loop's end of a batch, the journal writer's reports and journal recovery (runtime.recover), each
only as far as the simulation exercises them. Every decision is the production code's; here only the
I/O is modelled:
- `Store` is the journal: an append-only list of records; `flush` hands the records so far to the
  writer as one unit; after a seeded delay the writer takes every unit handed by then as one batch,
  and after another the engine loop hears it is durable (NodeShell.durable releases what waited). Units
  handed meanwhile go in the next batch, so one may be written after an earlier one failed. A write
  may fail (scripted, or config.journal_fail_rate): as node/store/journal.py promises, the failed
  batch's records are dropped, never written, and its units' tickets go to NodeShell.failed. A crash keeps
  the durable records and, with torn tails, any longer prefix of what had been handed to the writer
  (recovery trusts the file up to the first bad frame, not unit boundaries).
- `ForwarderModel` is `node/peer/forwarder.py` without threads: it drives the same pure ForwardSender
  (node/core/cluster/forward_sender.py: one call in flight, a batch of the oldest pending entries,
  drop up to the owner's high water on a reply, back off on failure or timeout, resend from the
  oldest), with simulated calls and timeouts.
- the raft member is the simulation's `RaftLog`; its feed arrives through `catch_up`; registration
  goes through the log (moves wait for every registered member), without addresses.
- the two memory budgets for queued messages, as runtime.Node sets them: the Broker's bodies
  (`message_memory_max_bytes`, node/core/dispatch/paging.py) and records (`record_memory_max_bytes`, cold tails of
  node/core/dispatch/cold.py; where groups follow their consumers, the protocol's sweeps read a tail through
  for the groups moving away, answered through `cold_records`). The shell hands the STOREs of each
  journal unit to `Broker.journalled` once the unit is durable (bodies may page out then, pending cold
  arrivals are let go), and forgets them when it failed.
  `PageIn` and `ReadRecords` go to the journal writer, which answers them in the order asked, after a
  seeded delay, from the durable records (Journal.read_bodies, read_records_after); a crash drops the
  answers still due. Recovery follows Node.recover: bodies kept in journal order up to the budget, or
  with a record budget each queue's messages as a cold tail read back as far as that budget goes
  (through `cold_records` first, as the runtime does); then the budgets page bodies out. Not modelled: the loop
  holding a unit nobody waits for until a later one (every batch ends with a unit here), per-queue
  memory budgets, browsers and purges (which read bodies and cold tails back too).
Never imports proton, grpc, pysyncobj, threading or time.
"""

from __future__ import annotations

import random
from collections import deque

from node.core.dispatch.broker import Broker
from node.core.cluster import MARK_PREFIX, PARK_PREFIX, ClusterProtocol
from node.core.cluster.feed import CONFLICT, MOVES_ALL, QUEUES_ALL, SNAPSHOT
from node.core.cluster.forward_sender import Call, ForwardSender
from node.core.durability import Durability
from node.core.effects import (AcceptSend, DeadLettered, Declared, Delayed, Deliver, DetachConsumer, Dropped, Enqueued,
                               Flushed, Kept, PageIn, ProposeClaim, ProposeDefinition, ProposeMoveClear,
                               ProposeQueueDeletion, ProposeQueueSeeds, ProposeTouch, QueueDeleted, ReadOutbound,
                               ReadRecords, Refuse, RefuseUnstored, Register, Removed, Reply, ReportConsumers, StopNode,
                               Stored, SubmitForward, Withdrawn, WriteFailed)
from node.core.errors import GrouperError
from node.core.shell import NodeShell
from node.core.dispatch.message import AVAILABLE, FETCHED, JOURNALLED, PAGED, STATE_MASK, Message
from node.core.cluster.outbound import Entry, parse_outbound_name
from node.core.dispatch.settings import QueueSettings

JOURNAL_RETRY_INTERVAL_MS = 1000  # node/amqp/loop.py: durable sends are refused this long after a failed write


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

    def crash(self, keep: int) -> None:
        assert self.durable <= keep <= self.handed
        del self.records[keep:]
        self.handed = self.taken = self.durable = keep

    def live_on_disk(self, name: str) -> dict[int, tuple]:
        """The live STORE records of `name` among the durable ones: seq -> record."""
        live: dict[int, tuple] = {}
        for record in self.records[:self.durable]:
            if record[0] == "store" and record[1] == name:
                live[record[2]] = record
            elif record[0] == "remove" and record[1] == name:
                live.pop(record[2], None)
            elif record[0] == "delete" and record[1] == name:
                live.clear()
        return live

    def live_after(self, name: str, after_seq: int, count: int) -> list[tuple]:
        """Journal.read_records_after: the next `count` live STORE records of `name` above `after_seq`
        among the durable ones, in seq order."""
        live = self.live_on_disk(name)
        return [live[seq] for seq in sorted(seq for seq in live if seq > after_seq)[:count]]

    def bodiless(self, bodies_max_bytes: int) -> set[tuple[str, int]]:
        """Journal.recover(bodies_max_bytes): (name, seq) of the live messages whose bodies recovery
        leaves in the journal. Bodies are kept in file order, oldest first, while they fit the budget; a
        REMOVE gives back what its message's body took; the cluster's own names (NUL-led) keep theirs."""
        kept_bytes = 0
        kept: dict[tuple[str, int], int] = {}  # live messages recovered with their bodies -> size
        dropped: set[tuple[str, int]] = set()
        for record in self.records:
            kind, name = record[0], record[1]
            if _reserved_name(name) or kind == "declare":
                continue
            if kind == "store":
                key, size_bytes = (name, record[2]), len(record[3])
                if kept_bytes + size_bytes > bodies_max_bytes:
                    dropped.add(key)
                    kept.pop(key, None)
                else:
                    kept_bytes += size_bytes
                    kept[key] = size_bytes
                    dropped.discard(key)
            elif kind == "remove":
                key = (name, record[2])
                dropped.discard(key)
                if key in kept:
                    kept_bytes -= kept.pop(key)
            elif kind == "delete":  # the journal forgets the queue's messages, not the bytes they kept
                for key in [key for key in kept if key[0] == name]:
                    del kept[key]
                dropped = {key for key in dropped if key[0] != name}
        return dropped

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
            elif kind == "delete":  # Journal.delete: the queue and its messages
                declarations.pop(record[1], None)
                messages.pop(record[1], None)
            else:
                declarations[record[1]] = record[2]
                messages.setdefault(record[1], {})
        return declarations, messages


def _nothing(_effect) -> None:
    """Effects for the node's logs and traces only: the simulation has neither."""


def _reserved_name(name: str) -> bool:
    return name.startswith("\x00")


# ---- forwarding ----------------------------------------------------------------------------------

class ForwarderModel:
    """node/peer/forwarder.py without threads: it drives the same ForwardSender, with simulated calls and
    timeouts (a reply after the call's timeout is one given up on)."""

    def __init__(self, node: "SimNode", owner: str):
        self.node = node
        self.sim = node.sim
        self.owner = owner
        config = self.sim.config
        self.sender = ForwardSender(batch_messages_max=config.batch_messages_max, retry_min_ms=config.retry_min_ms,
                                    retry_max_ms=config.retry_max_ms)
        self.call: tuple[int, Call] | None = None  # (the simulation's call number, the call in flight)
        self.kick_due = False
        self.closed = False

    def submit(self, entries: list[Entry], seq_bound: int = 0) -> None:
        try:
            self.sender.submit(entries, seq_bound)
        except ValueError as error:
            self.sim.violation(f"{self.node.node_id}: submitted to {self.owner}: {error}")
        budget = self.sim.config.outbound_memory_max_bytes
        pending = self.sender.pending
        held_bytes = sum(len(entry.payload) for entry in pending)
        if budget and len(pending) > 1 and held_bytes > budget:
            self.sim.violation(f"{self.node.node_id}'s forwarder to {self.owner} holds {held_bytes} bytes, past "
                               f"outbound_memory_max_bytes = {budget}")
        self.kick()

    def kick(self) -> None:
        sim, sender = self.sim, self.sender
        if self.closed:
            return
        call = sender.take_call(sim.now_ms)
        if call is None:
            if sender.in_flight is None and sender.pending and not self.kick_due:  # backing off
                self.kick_due = True
                sim.schedule(sender.retry_at_ms - sim.now_ms, self._kick_after_backoff, None)
            return
        number = sim.next_call_number()
        self.call = (number, call)
        sim.network.forward(self, number, call.entries, call.seq_bound, call.disputed_high_water)
        sim.schedule(sim.config.call_timeout_ms, lambda: self.timed_out(number), None)

    def _kick_after_backoff(self) -> None:
        self.kick_due = False
        self.kick()

    def replied(self, number: int, high_water: int | None) -> None:
        """The owner's answer to call `number`: its high water, None for an error status."""
        if self.closed or self.call is None or self.call[0] != number:
            return  # the reply of a call given up on
        call = self.call[1]
        self.call = None
        if high_water is None:
            outcome = self.sender.failed(call, "the owner answered with an error", self.sim.now_ms)
        else:
            outcome = self.sender.answered(call, high_water, self.sim.now_ms)
        if outcome.disputed:
            self.sim.stats["high_waters_disputed"] += 1
        if outcome.acked_high_water:
            self.node.acknowledged(self.owner, outcome.acked_high_water)
        self.kick()

    def timed_out(self, number: int) -> None:
        if self.closed or self.call is None or self.call[0] != number:
            return
        call = self.call[1]
        self.call = None
        self.sender.failed(call, "no answer within call_timeout_ms", self.sim.now_ms)
        self.kick()


# ---- the node ------------------------------------------------------------------------------------

class SimNode:
    def __init__(self, sim, node_id: str):
        self.sim = sim
        self.node_id = node_id
        self.store = Store()
        # delays of the queue definitions it proposes for queues its clients made (see RaftLog.propose)
        self.definitions_rng = random.Random(f"{sim.seed}:{node_id}")
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
        config = sim.config
        config_queues = config_queues or config.config_queues
        self.incarnation += 1
        self.alive = True
        self.down_holdings, self.down_outbound, self.down_marks, self.down_mids = set(), [], {}, []
        self.broker = Broker()
        # runtime.Node: the node's budgets of bodies and of records in memory (where groups follow their
        # consumers, a group moving away takes its cold messages along: the protocol sweeps the tail)
        self.broker.memory_max_bytes = config.message_memory_max_bytes
        self.broker.records.max_bytes = config.record_memory_max_bytes
        if config.read_back_max_bytes:
            self.broker.records.read_max_bytes = config.read_back_max_bytes
        self.protocol = ClusterProtocol(
            self.node_id, self.broker, handler_timeout_ms=config.handler_timeout_ms,
            group_timeout_ms=config.group_timeout_ms, routes_max=config.routes_max,
            seq_reserve_block=config.seq_reserve_block, counts=sim.stats,
            follows_consumers=config.route_follow_ms > 0,
            queue_seeds=tuple(settings.to_dict() for settings in config_queues),
            outbound_max_bytes=config.outbound_max_bytes, outbound_total_max_bytes=config.outbound_total_max_bytes,
            outbound_max_messages=config.outbound_max_messages,
            outbound_memory_max_bytes=config.outbound_memory_max_bytes)
        journalled = self.broker.journalled  # counted and checked where the shell calls it
        self.broker.journalled = lambda stores, now_ms: self._count_page_outs(lambda: journalled(stores, now_ms))
        # the node's own commit cycle (node/core/shell.py), as the engine loop runs it
        self.shell = NodeShell(self.broker, Durability(JOURNAL_RETRY_INTERVAL_MS), journalled=True,
                               protocol=self.protocol)
        self._forwarders: dict[str, ForwarderModel] = {}
        self._writer_due = False
        self.journal_stalled = False
        self.ticket = 0  # the journal's last unit handed to the writer (node/store/journal.py Journal.flush)
        self.units: deque = deque()  # (ticket, records[:end]) of the units handed, until written or failed
        self._carry = self._effect_table()  # effect type -> the simulated I/O that carries it out
        self._read_due_ms = 0  # the journal writer answers reads in the order they were asked
        self.consumers: dict[str, object] = {}  # consumer id -> the simulation's consumer
        self.live: dict[tuple[str, int], str] = {}  # (queue, seq) -> message id held by the broker
        # the replica: log entries applied so far, and when the next ones may be
        self.applied_index = 0
        self.apply_due_ms: dict[int, int] = {}
        self.replay_due_ms = sim.now_ms + sim.rng.randint(1, config.replay_ms_max)
        self.ready_target = sim.raft.commit_index if sim.raft.leader_up else None
        self.recover(config_queues)
        self.apply([])  # journals the declarations made during recovery
        sim.schedule(self.replay_due_ms - sim.now_ms, self.guarded(self.catch_up), None)

    @property
    def router(self):
        return self.protocol.router

    @property
    def outbound(self):
        return self.protocol.outbound

    @property
    def inbound(self):
        return self.protocol.inbound

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
                if name.startswith(PARK_PREFIX):  # parked behind a move: this node holds them
                    self.down_holdings.add((name[len(PARK_PREFIX):], record[4]))
                    self.down_mids.append(mid_of(record[3]))
                elif _reserved_name(name):
                    owner, queue = parse_outbound_name(name)
                    self.down_outbound.append(((queue, record[4]), owner, record[2]))
                else:
                    if mid_of(record[3]) not in self.sim.accepted_by_consumer:  # else a ghost: see Simulation.crash
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

    # ---- recovery (runtime.recover) ----------------------------------------------------------

    def recover(self, config_queues=()) -> None:
        """Node.recover (node/runtime.py): queues, the protocol's declarations and outbound store, messages.
        Past message_memory_max_bytes only records come back (bodies kept in journal order); with a record
        budget a queue's messages come back as a cold tail, read back as far as the budget goes before the
        node serves; then the budgets page bodies out."""
        config = self.sim.config
        cold = self.broker.records.max_bytes > 0
        bodies_max_bytes = config.message_memory_max_bytes
        bodiless = self.store.bodiless(bodies_max_bytes) if bodies_max_bytes and not cold else set()
        declarations, messages = self.store.recovered()
        for settings in config_queues:
            self.broker.declare_queue(settings)
        journalled = set()
        for name, values in declarations.items():
            if _reserved_name(name):
                assert self.protocol.recover_declaration(values), name
                continue
            settings = QueueSettings.from_dict(values)
            journalled.add(settings)
            if settings.name not in self.broker.queues:
                self.broker.declare_queue(settings)
        self.broker.forget_declared(journalled)
        outbound = {name: [self._message(record) for _, record in sorted(by_seq.items())]
                    for name, by_seq in messages.items() if _reserved_name(name)}
        if config.outbound_memory_max_bytes:  # runtime: the outbound store's bodies stay in the journal
            for name, recovered in outbound.items():
                if not name.startswith(PARK_PREFIX):
                    for message in recovered:
                        message.payload = None
        if outbound:
            self.protocol.recover_outbound(outbound)
        for name, by_seq in messages.items():
            if _reserved_name(name):
                continue
            if name not in self.broker.queues:
                self.broker.queue(name, create=True)
            seqs = sorted(by_seq)
            for seq in seqs:
                self.live[(name, seq)] = mid_of(by_seq[seq][3])
            if cold:  # Journal.recover(cold=True): only the live seqs and their payload bytes
                self.broker.restore_cold(name, seqs, sum(len(by_seq[seq][3]) for seq in seqs))
                self.sim.stats["cold_recovered"] += len(seqs)
                continue
            for seq in seqs:
                message = self._message(by_seq[seq])
                if (name, seq) in bodiless:
                    message.payload = None
                    self.sim.stats["recovered_bodiless"] += 1
                self.broker.restore(name, message)
        self.protocol.hold_recovered()
        if cold:
            self._read_cold_back()
        self._count_page_outs(lambda: self.broker.page_out(self.sim.now_ms))

    def _read_cold_back(self) -> None:
        """Node._read_cold_back: each cold tail's oldest records, read back as far as the record budget
        goes (Journal.read_records_after_now), before the node serves."""
        now_ms = self.sim.now_ms
        reads = [ReadRecords(name, queue.cold.after_seq, count, queue.cold.read_max_bytes)
                 for name, queue in sorted(self.broker.queues.items())
                 if queue.cold is not None and (count := queue.cold.ask(False))]
        while reads:
            read = reads.pop(0)
            records = self._records_after(read.queue, read.after_seq, read.count, read.max_bytes)
            effects = self.protocol.cold_records(read.queue, records, now_ms)  # holds what may live elsewhere
            if effects:
                self.carry_out(effects)
            for effect in self._count_page_outs(lambda: self.broker.promote(read.queue, records, now_ms)):
                if type(effect) is ReadRecords:
                    reads.append(effect)
                elif type(effect) is Dropped:
                    self.sim.violation(f"{self.node_id} dropped message {effect.seq} of {effect.queue} at "
                                       f"recovery: {effect.reason}")
                else:  # with no consumer attached yet, promotion asks for nothing else
                    raise AssertionError(f"recovery's read-back of cold records made {effect!r}")

    @staticmethod
    def _message(record: tuple) -> Message:
        _, _, seq, payload, group, enqueued_at_ms, _ = record
        return Message(payload, group, enqueued_at_ms=enqueued_at_ms, seq=seq)

    # ---- the journal (node/store/journal.py, as the engine loop uses it) -------------------------

    def journal_store(self, name: str, message: Message, origin=None) -> None:
        self.store.records.append(("store", name, message.seq, message.payload, message.group_id,
                                   message.enqueued_at_ms, origin))

    def journal_remove(self, name: str, seq: int) -> None:
        self.store.records.append(("remove", name, seq))

    def _read_later(self, fn) -> None:
        """The writer thread answers a read after its current batch, in the order the reads were asked."""
        sim = self.sim
        self._read_due_ms = max(self._read_due_ms, sim.now_ms + sim.rng.randint(1, sim.config.write_ms_max))
        sim.schedule(self._read_due_ms - sim.now_ms, self.guarded(fn), None)

    def read_bodies(self, name: str, seqs: tuple) -> None:
        """Journal.read_bodies, answered on the engine loop (AmqpServer.journal_bodies): what the durable
        records hold of each seq (None: no live STORE)."""
        live = self.store.live_on_disk(name)
        bodies = {seq: live[seq][3] if seq in live else None for seq in seqs}
        self.sim.stats["bodies_read_back"] += sum(body is not None for body in bodies.values())
        self.apply(self.broker.page_in(name, bodies, self.sim.now_ms))

    def _records_after(self, name: str, after_seq: int, count: int, max_bytes: int) -> dict:
        """Journal._read_after: the records in seq order, stopping after the one whose body brings the
        bodies read to `max_bytes`."""
        records: dict = {}
        body_bytes = 0
        for record in self.store.live_after(name, after_seq, count):
            if body_bytes >= max_bytes:
                self.sim.stats["cold_reads_cut"] += 1
                break
            message = records[record[2]] = self._message(record)
            body_bytes += message.size_bytes
        self.sim.stats["cold_reads"] += 1
        self.sim.stats["cold_read_back"] += len(records)
        return records

    def read_records_after(self, name: str, after_seq: int, count: int, max_bytes: int) -> None:
        """Journal.read_records_after, answered on the engine loop (AmqpServer.journal_records): a sweep's
        records go to the cluster protocol (ClusterLink.cold_records), the queue's own to Broker.promote."""
        records = self._records_after(name, after_seq, count, max_bytes)
        effects = self.protocol.cold_records(name, records, self.sim.now_ms)
        if effects is not None:
            self.carry_out(effects)
            return
        self.apply(self._count_page_outs(lambda: self.broker.promote(name, records, self.sim.now_ms)))

    def _count_page_outs(self, call):
        """call(), counting the bodies it paged out (Broker.page_out runs inside journalled and promote)
        and checking the node's budget held where it could."""
        def paged() -> int:
            return sum(queue.pager.page_outs for queue in self.broker.queues.values() if queue.pager is not None)
        before = paged()
        result = call()
        self.sim.stats["bodies_paged_out"] += paged() - before
        self._check_body_budget()
        return result

    def _check_body_budget(self) -> None:
        """After a page-out, bodies past message_memory_max_bytes are only those paging may not take:
        not yet on disk, delivered, read back for dispatch, or of a group held for a hand-over."""
        budget_bytes = self.sim.config.message_memory_max_bytes
        if not budget_bytes:
            return
        resident_bytes = 0
        pageable_bytes = 0
        for queue in self.broker.queues.values():
            if queue.pager is None:
                continue
            resident_bytes += queue.pager.pageable_bytes
            held = queue.held_keys
            for message in queue._store.log:
                flags = message.flags
                if flags & (STATE_MASK | PAGED | FETCHED) == AVAILABLE and flags & JOURNALLED \
                        and not (held and message.group is not None and message.group.key in held):
                    pageable_bytes += message.size_bytes
        if resident_bytes > budget_bytes and pageable_bytes:
            self.sim.violation(f"{self.node_id} keeps {resident_bytes} bytes of bodies, past "
                               f"message_memory_max_bytes = {budget_bytes}, with {pageable_bytes} of them on "
                               f"disk and pageable")

    def read_outbound(self, name: str, seqs: tuple) -> None:
        """Journal.read_records for paged outbound entries, answered on the engine loop: what the durable
        records hold of each seq (None: no live STORE)."""
        live = self.store.live_on_disk(name)
        records = {seq: self._message(live[seq]) if seq in live else None for seq in seqs}
        self.carry_out(self.protocol.outbound_read(name, records))

    def journal_declare(self, values: dict) -> None:
        self.store.records.append(("declare", values["name"], dict(values)))

    def end_of_batch(self) -> None:
        """AmqpServer._end_batch: the shell's end of batch (the cluster protocol's included), then one journal
        unit; what was waiting for a unit already on disk is released at once (NodeShell.batch_ended)."""
        if not self.alive:
            return
        store = self.store
        shell = self.shell
        if not (self.protocol.batch_due or shell.waiting or store.handed != len(store.records)):
            return  # an empty batch: nothing to propose, forward, journal or confirm
        if not self.execute(shell.end_batch(self.sim.now_ms)):
            return  # stopped
        if store.handed != len(store.records):  # Journal.flush: a new unit only when records are pending
            store.handed = len(store.records)
            self.ticket += 1
            self.units.append((self.ticket, store.handed))
        if not self.execute(shell.batch_ended(self.ticket, self.sim.now_ms)):
            return
        if store.durable < store.handed and not self._writer_due:
            self._writer_due = True
            self.sim.schedule(self.sim.rng.randint(0, self.sim.config.flush_ms_max),
                              self.guarded(self._write), None)

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
        """AmqpServer.journal_durable for the units now on disk."""
        ticket = None
        while self.units and self.units[0][1] <= self.store.durable:
            ticket = self.units.popleft()[0]
        if ticket is not None:  # bodies stored by then may page out now (Broker.journalled), pending cold ones let go
            self.execute(self.shell.durable(ticket, self.sim.now_ms))

    def _write_failed(self, upto: int) -> None:
        """Journal._fail_batch (its records are dropped, not retried), then AmqpServer.journal_failed for
        its units; later units stay handed, their records moved down past the dropped ones."""
        store = self.store
        failed = upto - store.durable
        del store.records[store.durable:upto]
        store.handed -= failed
        store.taken = store.durable
        reason = "journal write failed (simulated)"
        self.sim.trace(f"  {self.node_id} journal write failed: {failed} records dropped")
        self.sim.stats["journal_failures"] += 1
        ticket = None
        while self.units and self.units[0][1] <= upto:
            ticket = self.units.popleft()[0]
        self.units = deque((later, end - failed) for later, end in self.units)
        if ticket is not None:
            self.execute(self.shell.failed(ticket, reason, self.sim.now_ms))

    def unflushed(self) -> int:
        """What still waits for the journal (for the simulation's report of what is left)."""
        return self.shell.durability.waiting_count

    # ---- the server's side (node/amqp/loop.py AmqpServer, node/amqp/executor.py) ----------------

    def after_flush(self, callback) -> None:
        """callback(None) once everything journalled so far is durable, callback(reason) if it failed."""
        self.shell.after_flush(callback)

    def apply(self, effects: list) -> None:
        """AmqpServer.apply: the broker's effects, through the shell."""
        self.execute(self.shell.broker_effects(effects))

    def execute(self, effects: list) -> bool:
        """AmqpServer.execute with the simulation's I/O: False once an effect stopped the node (StopNode):
        the rest dies with the process."""
        table = self._carry
        incarnation = self.incarnation
        for effect in effects:
            carry = table.get(type(effect))
            if carry is None:
                raise AssertionError(f"{self.node_id}: the shell asked for {effect!r}, which the simulation "
                                     f"does not carry out")
            carry(effect)
            if not (self.alive and self.incarnation == incarnation):
                return False
        return True

    def _effect_table(self) -> dict:
        sim = self.sim
        nothing = _nothing
        return {
            Deliver: lambda effect: sim.delivered(self, effect), Stored: self._stored, Removed: self._removed,
            Withdrawn: lambda effect: self.live.pop((effect.queue, effect.seq), None),  # never stored: no record
            Declared: lambda effect: self.journal_declare(effect.values),
            PageIn: lambda effect: self._read_later(lambda: self.read_bodies(effect.queue, effect.seqs)),
            ReadRecords: lambda effect: self._read_later(lambda: self.read_records_after(
                effect.queue, effect.after_seq, effect.count, effect.max_bytes)),
            DetachConsumer: lambda effect: self.consumers.pop(effect.consumer_id, None),
            Dropped: lambda effect: sim.violation(f"{self.node_id} dropped message {effect.seq} of {effect.queue}: "
                                                  f"{effect.reason}"),
            Delayed: nothing, Enqueued: nothing, DeadLettered: nothing, Kept: nothing, WriteFailed: nothing,
            AcceptSend: self._accepted, Refuse: lambda effect: sim.producer_outcome(effect.incoming, effect.error),
            RefuseUnstored: lambda effect: sim.producer_outcome(effect.incoming, effect.error),
            Flushed: lambda effect: effect.fn(effect.reason),
            SubmitForward: lambda effect: self._forwarder(effect.owner).submit(effect.entries, self.broker.next_seq),
            ReadOutbound: self._read_outbound, ProposeClaim: self._propose_claim, ProposeTouch: self._propose_touch,
            ReportConsumers: lambda effect: sim.raft.propose(("report_consumers", self.node_id, effect.counts,
                                                              effect.now_ms)),
            ProposeMoveClear: lambda effect: sim.raft.propose(
                ("move_clear", tuple(tuple(entry) for entry in effect.entries), self.node_id)),
            Register: lambda effect: sim.raft.propose(("register_node", self.node_id, effect.now_ms)),
            ProposeQueueSeeds: lambda effect: self._propose_seeds(effect.seeds),
            ProposeDefinition: lambda effect: self._propose_definition(effect.values),
            ProposeQueueDeletion: self._propose_deletion, QueueDeleted: self._queue_deleted,
            Reply: lambda effect: effect.reply_to(effect.high_water, effect.error),
            StopNode: lambda effect: self.stop(effect.reason),
        }

    def _stored(self, effect: Stored) -> None:
        self.journal_store(effect.queue, effect.message, effect.origin)
        if not _reserved_name(effect.queue):  # the cluster's own records (outbound, parked) are not the broker's
            self.live[(effect.queue, effect.message.seq)] = mid_of(effect.message)

    def _removed(self, effect: Removed) -> None:
        self.journal_remove(effect.queue, effect.seq)
        self.live.pop((effect.queue, effect.seq), None)

    def _accepted(self, effect: AcceptSend) -> None:
        assert effect.tell  # the simulation's producers wait for the outcome
        self.sim.producer_outcome(effect.incoming, None)

    def consumer_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for consumer in self.consumers.values():
            counts[consumer.queue] = counts.get(consumer.queue, 0) + 1
        return counts

    def receive(self, delivery, queue_name: str, group: str, payload: bytes, now_ms: int) -> None:
        """AmqpServer._receive for a grouped message on a durable queue, in a cluster."""
        try:
            queue = self.broker.queue(queue_name, create=True)
            reason = self.shell.refusing(now_ms)
            if reason is not None:
                raise GrouperError(f"the node cannot store messages right now ({reason})")
            message = Message(payload, group)
            queue.check_group_id(message.group_id)
            route_key = queue.route_key(message.group_id)
            assert route_key is not None
            self.carry_out(self.protocol.arrive(delivery, queue.settings.name, route_key, message, True, False,
                                                now_ms))
        except GrouperError as error:
            self.sim.producer_outcome(delivery, error)

    # ---- ClusterLink (node/cluster.py): events in --------------------------------------------

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
                self.carry_out(self.protocol.applied(kind, payload, at_ms, now_ms))
        if not self.router.ready and self.ready_target is not None and self.applied_index >= self.ready_target:
            self.carry_out(self.protocol.ready(now_ms))

    def install_snapshot(self, index: int) -> None:
        """pysyncobj replaced the replica with the table as of `index` (a restart or a lagging member)."""
        self.applied_index = index
        self.apply_due_ms = {i: due for i, due in self.apply_due_ms.items() if i > index}
        self.carry_out(self.protocol.applied(SNAPSHOT, self.sim.raft.routes_at(index), None, self.sim.now_ms))
        self.carry_out(self.protocol.applied(MOVES_ALL, self.sim.raft.moves_at(index), None, self.sim.now_ms))
        if self.sim.config.queue_definitions or self.sim.config.config_queues:  # the log holds definitions
            self.carry_out(self.protocol.applied(QUEUES_ALL, self.sim.raft.definitions_at(index), None,
                                                 self.sim.now_ms))

    def tick(self, now_ms: int) -> None:
        """AmqpServer._tick: the broker's timers, then the cluster's."""
        self.apply(self.broker.tick(now_ms))
        self.carry_out(self.protocol.tick(now_ms, self.consumer_counts()))

    def acknowledged(self, owner: str, high_water: int) -> None:
        self.carry_out(self.protocol.acknowledged(owner, high_water))

    def handle_forward(self, source: str, entries: list[Entry], reply, seq_bound: int = 0,
                       disputed_high_water: int = 0) -> None:
        """ClusterLink.handle_forward's engine loop part: reply(high_water) once the batch is stored here,
        reply(None) when it was refused or its journal write failed."""
        for entry in entries:
            self.sim.forwarded_from[(self.node_id, mid_of(entry.payload))] = source
        self.carry_out(self.protocol.forward_received(
            source, entries, lambda high_water, error: reply(high_water if error is None else None),
            self.sim.now_ms, seq_bound, disputed_high_water))

    # ---- ClusterLink (node/cluster.py): effects out ------------------------------------------

    def carry_out(self, effects: list) -> None:
        """The protocol's effects, through the node shell (which enqueues, accepts and refuses itself)."""
        self.execute(self.shell.from_protocol(effects))

    def _read_outbound(self, effect: ReadOutbound) -> None:
        sim = self.sim
        for name, seqs in effect.reads:
            sim.schedule(sim.rng.randint(1, sim.config.write_ms_max),
                         self.guarded(lambda name=name, seqs=seqs: self.read_outbound(name, seqs)), None)

    def _propose_claim(self, effect: ProposeClaim) -> None:
        sim, protocol, keys = self.sim, self.protocol, effect.keys
        sim.raft.propose(("claim", tuple(keys), self.node_id, effect.now_ms, sim.config.placement),
                         self.guarded(lambda reason: protocol.claim_failed(keys, reason)))

    def _propose_touch(self, effect: ProposeTouch) -> None:
        sim, protocol = self.sim, self.protocol
        sim.raft.propose(("touch", tuple(effect.entries), effect.now_ms),
                         self.guarded(lambda reason: protocol.touch_failed(sim.now_ms)))

    def _propose_deletion(self, effect: ProposeQueueDeletion) -> None:
        sim, protocol, name = self.sim, self.protocol, effect.name
        sim.raft.propose(("delete_queue", name, effect.seen_revision),
                         self.guarded(lambda reason: self.carry_out(protocol.deletion_proposed(name, reason, sim.now_ms))),
                         self.guarded(lambda: self.carry_out(protocol.deletion_proposed(name, None, sim.now_ms))),
                         self.definitions_rng)

    def _queue_deleted(self, effect: QueueDeleted) -> None:
        self.store.records.append(("delete", effect.queue))
        self.live = {key: mid for key, mid in self.live.items() if key[0] != effect.queue}

    def _propose_seeds(self, seeds: tuple) -> None:
        """ClusterLink._propose_queue_seeds: one proposal per seed; the protocol hears once all committed,
        or that one failed."""
        sim, protocol = self.sim, self.protocol
        waiting = [len(seeds), False]

        def done(failed: bool) -> None:
            waiting[0] -= 1
            waiting[1] = waiting[1] or failed
            if waiting[0] == 0:
                protocol.queue_seeds_failed(sim.now_ms) if waiting[1] else protocol.queues_seeded()
        for values in seeds:
            sim.raft.propose(("define_queue", values, True), self.guarded(lambda reason: done(True)),
                             self.guarded(lambda: done(False)))

    def _propose_definition(self, values: dict) -> None:
        """ClusterLink._propose_definition: the outcome read from the log's definitions once committed
        (the model's raft hands back no command results): another definition held means CONFLICT."""
        sim, protocol = self.sim, self.protocol

        def committed():
            held = sim.raft.queues.definitions.get(values["name"])
            outcome = CONFLICT if held is not None and held != values else None
            self.carry_out(protocol.definition_proposed(values, None, outcome, held, sim.now_ms))
        sim.raft.propose(("define_queue", values, False),
                         self.guarded(lambda reason: self.carry_out(
                             protocol.definition_proposed(values, reason, None, None, sim.now_ms))),
                         self.guarded(committed), self.definitions_rng)

    def stop(self, reason: str) -> None:
        """ClusterLink._stop_node: the process exits at once (its journal keeps what is durable) and the
        supervisor starts it again `restart_ms` later."""
        sim = self.sim
        sim.trace(f"  {self.node_id} stops: {reason}")
        sim.stats["stops"] += 1
        sim.crash(self, self.store.durable)
        incarnation = self.incarnation

        def supervisor():
            if not self.alive and self.incarnation == incarnation:  # not started again meanwhile
                sim.restart(self)
        sim.schedule(sim.config.restart_ms, supervisor, f"{self.node_id} restarts after its stop")

    def _forwarder(self, owner: str) -> ForwarderModel:
        forwarder = self._forwarders.get(owner)
        if forwarder is None:
            forwarder = self._forwarders[owner] = ForwarderModel(self, owner)
        return forwarder
