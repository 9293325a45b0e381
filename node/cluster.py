"""The node's side of a cluster: the adapter that carries out what the cluster protocol decides.

node/core/cluster/ decides (routing, the outbound store, seq reservations, taking
forwarded batches); this module feeds it the clock and the events, and carries out its effects with
the server (node/amqp/loop.py), the journal, one Forwarder per owner and the grouping handler; a
StopNode ends the process at once (exit 70), for the supervisor to restart it.
Engine loop thread only, except the callbacks of other threads, which only post to the engine loop
through the bridge: `handle_forward` (a gRPC pool thread, which then waits for the reply), the
forwarders' acks and the handler's proposal outcomes (the raft member channel's reader thread).
"""

from __future__ import annotations

import logging
import os
import threading
import time

from handler.route_table import REFUSED, ROUTES, SNAPSHOT
from node.core.cluster import ClusterProtocol
from node.core.cluster.routes import TOUCH_RETRY_INTERVAL_MS
from node.core.effects import (AcceptWhenStored, AfterFlush, ApplyBroker, EnqueueLocal, JournalDeclare,
                               JournalRemove, JournalStore, ProposeClaim, ProposeDefinition, ProposeMoveClear,
                               ProposeQueueDeletion, ProposeQueueSeeds, ProposeTouch, QueueDeleted, ReadOutbound,
                               ReadRecords, Refuse, Register, Reply, ReportConsumers, StopNode, SubmitForward)
from node.core.outbound import Entry
from node.core.tally import DECISION_BOUNDS_MS, LatencyTally
from node.peer.forwarder import Forwarder

log = logging.getLogger("grouper.cluster")

EXIT_STOPPED = 70  # the exit status of a StopNode, as of the engine loop's stop on a broken invariant
# raft decisions are timed per group from this node's claim to its route arriving here, in
# nanoseconds (the pure core's clock counts whole ms, too coarse for a 5 ms target); at most this
# many claims are timed at once, the rest pass untimed
DECISIONS_TIMED_MAX = 100_000


class ClusterLink:
    def __init__(self, node_id: str, config, broker, journal, clock_ms, peer_tls=None):
        self.node_id = node_id
        self.peer_tls = peer_tls  # node.peer.cluster_secrets.ClusterTls: forwarders dial with it; None: plaintext
        self.forward_signer = None  # node.peer.signature.Signer: without peer_tls, the cluster credential
        self.config = config
        self.broker = broker
        self.journal = journal
        self.clock_ms = clock_ms
        self.server = self.handler = self.bridge = None  # attached at start, after recovery
        self.addresses: dict[str, str] = {}  # this node's peer_address, amqp_address, admin_address
        self.protocol = ClusterProtocol(
            node_id, broker, handler_timeout_ms=config.handler_timeout_ms,
            group_timeout_ms=config.group_timeout_ms, routes_max=config.routes_max,
            journalled=journal is not None, follows_consumers=config.route_follow_ms > 0,
            queue_seeds=tuple(settings.to_dict() for settings in config.queues),
            outbound_max_bytes=config.outbound_max_bytes, outbound_total_max_bytes=config.outbound_total_max_bytes,
            outbound_max_messages=config.outbound_max_messages,
            outbound_memory_max_bytes=config.outbound_memory_max_bytes)
        self._forwarders: dict[str, Forwarder] = {}
        self._claimed_ns: dict[tuple, int] = {}  # (queue, group) -> when this node proposed its claim
        self.raft_decision_latency = LatencyTally(DECISION_BOUNDS_MS)
        self._carry = {
            EnqueueLocal: self._enqueue_local, AcceptWhenStored: self._accept_when_stored,
            Refuse: self._refuse, JournalStore: self._journal_store, JournalRemove: self._journal_remove,
            JournalDeclare: self._journal_declare, ApplyBroker: self._apply_broker,
            AfterFlush: self._after_flush, SubmitForward: self._submit_forward, ReadOutbound: self._read_outbound,
            ReadRecords: self._read_records,
            ProposeClaim: self._propose_claim, ProposeTouch: self._propose_touch,
            ProposeMoveClear: self._propose_move_clear,
            ProposeQueueSeeds: self._propose_queue_seeds, QueueDeleted: self._queue_deleted,
            ProposeDefinition: self._propose_definition, ProposeQueueDeletion: self._propose_queue_deletion,
            ReportConsumers: self._report_consumers, Register: self._register, Reply: self._reply,
            StopNode: self._stop_node,
        }

    def attach(self, server, handler, bridge, addresses: dict[str, str]) -> None:
        self.server, self.handler, self.bridge, self.addresses = server, handler, bridge, addresses

    # what the runtime, the admin calls and /metrics read (engine loop thread)

    @property
    def router(self):
        return self.protocol.router

    @property
    def members(self) -> dict:
        return self.protocol.members

    @property
    def registered(self) -> bool:
        return self.protocol.registered

    @property
    def closed(self) -> bool:
        return self.protocol.closed

    def status(self) -> dict:
        return self.protocol.status()

    def defines(self, queue: str) -> bool:
        """Whether `queue` has a cluster-wide definition, as this node's replica last heard: every node
        holds it, so its groups can be routed to any of them."""
        return queue in self.protocol.definitions

    # ---- events in (engine loop thread) ------------------------------------------------------

    def recover_declaration(self, values: dict) -> bool:
        return self.protocol.recover_declaration(values)

    def recover_outbound(self, messages_by_name: dict) -> int:
        return self.protocol.recover_outbound(messages_by_name)

    def outbound_read(self, name: str, records: dict) -> None:
        """The journal read back paged entries of outbound channel `name` (engine loop thread)."""
        effects = self.protocol.outbound_read(name, records)
        if effects:
            self.carry_out(effects)

    def cold_records(self, queue: str, records: dict) -> bool:
        """The journal read back records of a queue's cold tail (engine loop thread): True when they were
        a sweep's (groups moving away, node/core/cluster/sweep.py), False for the queue's own read-back,
        which Broker.promote takes next (the protocol first holds the groups living elsewhere)."""
        effects = self.protocol.cold_records(queue, records, self.clock_ms())
        if effects is None:
            return False
        self.carry_out(effects)
        return True

    def hold_recovered(self) -> None:
        self.protocol.hold_recovered()

    def arrive(self, incoming, queue: str, route_key: str, message, durable: bool,
               producer_settled: bool, now_ms: int) -> None:
        effects = self.protocol.arrive(incoming, queue, route_key, message, durable, producer_settled, now_ms)
        if effects:
            self.carry_out(effects)

    def quiesced(self) -> None:
        if self.protocol.batch_due:
            self.carry_out(self.protocol.quiesced(self.clock_ms()))

    def applied(self, kind: str, payload, at_ms) -> None:
        if self._claimed_ns and kind in (ROUTES, REFUSED, SNAPSHOT):
            self._decided(kind, payload)
        self.carry_out(self.protocol.applied(kind, payload, at_ms, self.clock_ms()))

    def ready(self) -> None:
        self.carry_out(self.protocol.ready(self.clock_ms()))

    def tick(self, now_ms: int) -> None:
        self.carry_out(self.protocol.tick(now_ms, self.server.consumer_counts()))

    def acknowledged(self, owner: str, high_water: int) -> None:
        self.carry_out(self.protocol.acknowledged(owner, high_water))

    # ---- owner side: a gRPC pool thread ------------------------------------------------------

    def handle_forward(self, source: str, entries: list[Entry], timeout_ms: int, seq_bound: int = 0,
                       disputed_high_water: int = 0) -> int:
        """gRPC pool thread: enqueue a forwarded batch and return once it is stored here."""
        done = threading.Event()
        outcome: dict = {}

        def reply(high_water, error):  # engine loop thread
            outcome["high_water"], outcome["error"] = high_water, error
            done.set()

        self.bridge.post(lambda: self.carry_out(
            self.protocol.forward_received(source, entries, reply, self.clock_ms(), seq_bound, disputed_high_water)))
        if not done.wait(timeout_ms / 1000):
            raise TimeoutError(f"the owner did not store the batch within {timeout_ms} ms")
        if outcome["error"] is not None:
            raise outcome["error"]
        return outcome["high_water"]

    # ---- effects out (engine loop thread) ------------------------------------------------------

    def carry_out(self, effects: list) -> None:
        carry = self._carry
        for effect in effects:
            carry[type(effect)](effect)

    def _enqueue_local(self, effect: EnqueueLocal) -> None:
        self.server.enqueue_local(*effect)  # the record's fields are enqueue_local's arguments, in order

    def _accept_when_stored(self, effect: AcceptWhenStored) -> None:
        self.server.accept_when_stored(effect.incoming, effect.durable, effect.producer_settled)

    def _refuse(self, effect: Refuse) -> None:
        self.server.refuse(effect.incoming, effect.error)

    def _journal_store(self, effect: JournalStore) -> None:
        self.journal.store(effect.name, effect.message)

    def _journal_remove(self, effect: JournalRemove) -> None:
        self.journal.remove(effect.name, effect.seq)

    def _journal_declare(self, effect: JournalDeclare) -> None:
        self.journal.declare(effect.values)

    def _apply_broker(self, effect: ApplyBroker) -> None:
        self.server.apply(effect.effects)

    def _after_flush(self, effect: AfterFlush) -> None:
        what, protocol = effect.what, self.protocol
        self.server.after_flush(lambda reason: self.carry_out(protocol.flushed(what, reason, self.clock_ms())))

    def _submit_forward(self, effect: SubmitForward) -> None:
        # the next seq: above every forward seq this node gave, before any restart too (they are reserved)
        self._forwarder(effect.owner).submit(effect.entries, self.broker.next_seq)

    def _read_outbound(self, effect: ReadOutbound) -> None:
        for name, seqs in effect.reads:  # answered through outbound_read, on the engine loop
            self.journal.read_records(name, seqs)

    def _read_records(self, effect: ReadRecords) -> None:  # answered through cold_records, on the engine loop
        self.journal.read_records_after(effect.queue, effect.after_seq, effect.count, effect.max_bytes)

    def _propose_claim(self, effect: ProposeClaim) -> None:
        if len(self._claimed_ns) < DECISIONS_TIMED_MAX:
            claimed_ns = time.monotonic_ns()
            for queue, group in effect.keys:
                self._claimed_ns.setdefault((queue, group), claimed_ns)
        self.handler.claim(effect.keys, effect.now_ms, on_failed=self._claim_failed_elsewhere)

    def _claim_failed_elsewhere(self, keys, reason: str) -> None:  # raft member channel thread
        self.bridge.post(lambda: self._claim_failed(keys, reason))

    def _claim_failed(self, keys, reason: str) -> None:
        for queue, group in keys:
            self._claimed_ns.pop((queue, group), None)
        self.protocol.claim_failed(keys, reason)

    def _decided(self, kind: str, payload) -> None:
        """Time the claims this node made whose routes arrived; forget those refused or caught up on
        by a snapshot (no decision of theirs was seen here)."""
        decided_ns = time.monotonic_ns()
        claimed_ns, tally = self._claimed_ns, self.raft_decision_latency
        for entry in payload:
            since_ns = claimed_ns.pop((entry[0], entry[1]), None)
            if since_ns is not None and kind == ROUTES and entry[2] is not None:
                tally.observe((decided_ns - since_ns) / 1e6)

    def _propose_touch(self, effect: ProposeTouch) -> None:
        self.handler.touch(effect.entries, effect.now_ms, on_failed=self._touch_failed_elsewhere)

    def _touch_failed_elsewhere(self, entries, reason: str) -> None:  # raft member channel thread
        log.info("refreshing %d routes failed (%s); retrying in %d ms", len(entries), reason,
                 TOUCH_RETRY_INTERVAL_MS)
        self.bridge.post(lambda: self.protocol.touch_failed(self.clock_ms()))

    def _propose_move_clear(self, effect: ProposeMoveClear) -> None:
        self.handler.move_clear(effect.entries)  # a lost one is proposed again at a later tick

    def _propose_queue_seeds(self, effect: ProposeQueueSeeds) -> None:
        waiting = [len(effect.seeds)]
        failures: list = []

        def done(reason, _result, name):  # raft member channel thread
            if reason is not None:
                failures.append(f"{name}: {reason}")
            waiting[0] -= 1
            if waiting[0] == 0:
                if failures:
                    log.info("proposing config-file queues as cluster-wide definitions failed (%s); retrying",
                             "; ".join(failures))
                    self.bridge.post(lambda: self.protocol.queue_seeds_failed(self.clock_ms()))
                else:
                    self.bridge.post(self.protocol.queues_seeded)
        for values in effect.seeds:
            self.handler.define_queue(values, True, lambda reason, result, name=values["name"]: done(reason, result, name))

    def _propose_definition(self, effect: ProposeDefinition) -> None:
        values, protocol = effect.values, self.protocol

        def done(reason, result):  # raft member channel thread
            outcome, held = (result[0], result[1]) if reason is None else (None, None)
            self.bridge.post(lambda: self.carry_out(protocol.definition_proposed(
                values, reason, outcome, held, self.clock_ms())))
        self.handler.define_queue(values, False, done)

    def _propose_queue_deletion(self, effect: ProposeQueueDeletion) -> None:
        name, protocol = effect.name, self.protocol

        def done(reason, _result):  # raft member channel thread
            self.bridge.post(lambda: self.carry_out(protocol.deletion_proposed(name, reason, self.clock_ms())))
        self.handler.delete_queue(name, effect.seen_revision, done)

    def _queue_deleted(self, effect: QueueDeleted) -> None:
        self.server.detach_producers_of(effect.queue)
        if effect.durable and self.journal is not None:
            self.journal.delete(effect.queue)

    def _report_consumers(self, effect: ReportConsumers) -> None:
        self.handler.report_consumers(effect.counts, effect.now_ms)

    def _register(self, effect: Register) -> None:
        addresses = self.addresses
        self.handler.register(addresses["peer_address"], addresses["amqp_address"], addresses["admin_address"],
                              effect.now_ms, on_done=self._registered_elsewhere)

    def _registered_elsewhere(self, error) -> None:  # raft member channel thread
        if error is None:
            self.bridge.post(self.protocol.registered_now)

    def _reply(self, effect: Reply) -> None:
        effect.reply_to(effect.high_water, effect.error)

    def _stop_node(self, effect: StopNode) -> None:
        self.stop_node(effect.reason)

    @staticmethod
    def stop_node(reason: str) -> None:
        """Any thread. At once, as the engine loop stops on a broken invariant: a clean shutdown would
        go on serving, while it drains, messages the journal does not hold (or, without its raft
        member, groups it cannot route)."""
        log.critical("stopping the node: %s; the supervisor restarts it and it recovers from its journal", reason)
        logging.shutdown()
        os._exit(EXIT_STOPPED)

    def _forwarder(self, owner: str) -> Forwarder:
        forwarder = self._forwarders.get(owner)
        if forwarder is None:
            protocol = self.protocol
            forwarder = Forwarder(
                self.node_id, owner,
                resolve_address=lambda: protocol.peer_addresses.get(owner),
                on_acked=lambda high_water: self.bridge.post(lambda: self.acknowledged(owner, high_water)),
                call_timeout_ms=self.config.forward_timeout_ms, tls=self.peer_tls, signer=self.forward_signer)
            self._forwarders[owner] = forwarder
        return forwarder

    # ---- shutdown ----------------------------------------------------------------------------

    def close(self) -> None:
        self.protocol.close()
        for forwarder in self._forwarders.values():
            forwarder.close()
