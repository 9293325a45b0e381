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
from node.core.effects import (ProposeClaim, ProposeDefinition, ProposeMoveClear, ProposeQueueDeletion,
                               ProposeQueueSeeds, ProposeTouch, QueueDeleted, ReadOutbound, Register, Reply,
                               ReportConsumers, StopNode, SubmitForward)
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
        self.peer_tls = peer_tls  # node.peer.credentials.ClusterTls: forwarders dial with it; None: plaintext
        self.forward_signer = None  # node.peer.signature.Signer: without peer_tls, the cluster credential
        self.config = config
        self.broker = broker
        self.journal = journal
        self.clock_ms = clock_ms
        self.server = self.handler = self.bridge = None  # attached at start, after recovery
        self.shell = None  # the server's node shell (node/core/shell.py), which runs the protocol once attached
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
        # the cluster's rows of the server's one effect table (node/amqp/executor.py); the node shell
        # handles the protocol's sends and turns its journal effects into the broker's
        self._carry = {
            SubmitForward: self._submit_forward, ReadOutbound: self._read_outbound,
            ProposeClaim: self._propose_claim, ProposeTouch: self._propose_touch,
            ProposeMoveClear: self._propose_move_clear,
            ProposeQueueSeeds: self._propose_queue_seeds, QueueDeleted: self._queue_deleted,
            ProposeDefinition: self._propose_definition, ProposeQueueDeletion: self._propose_queue_deletion,
            ReportConsumers: self._report_consumers, Register: self._register, Reply: self._reply,
            StopNode: self._stop_node,
        }

    def attach(self, server, handler, bridge, addresses: dict[str, str]) -> None:
        self.server, self.handler, self.bridge, self.addresses = server, handler, bridge, addresses
        self.shell = server.shell
        self.shell.protocol = self.protocol
        server.carry.update(self._carry)

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
        """The protocol's `effects`, through the node shell, carried out by the server's one table."""
        self.server.execute(self.shell.from_protocol(effects))

    def _submit_forward(self, effect: SubmitForward) -> None:
        # the next seq: above every forward seq this node gave, before any restart too (they are reserved)
        self._forwarder(effect.owner).submit(effect.entries, self.broker.next_seq)

    def _read_outbound(self, effect: ReadOutbound) -> None:
        for name, seqs in effect.reads:  # answered through outbound_read, on the engine loop
            self.journal.read_records(name, seqs)

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
