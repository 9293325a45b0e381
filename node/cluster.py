"""The node's side of a cluster: the adapter that carries out what the cluster protocol decides.

node/core/cluster/ decides (routing, the outbound store, seq reservations, taking
forwarded batches); this module feeds it the clock and the events, and carries out its effects with
the server (node/amqp/loop.py), the journal, one Forwarder per owner and the grouping handler; a
StopNode ends the process at once (exit 70), for the supervisor to restart it.
Engine loop thread only, except the callbacks of other threads, which only post to the engine loop
through the bridge: `handle_forward` (a gRPC pool thread, which then waits for the reply), the
forwarders' acks and the handler's proposal outcomes (the raft member channel's reader thread).
What goes to the grouping handler, and what comes back of it, is its collaborator's:
node/cluster_proposals.py (ClusterProposals, which also carries out Reply, QueueDeleted and StopNode);
the forwarders are node/peer/forwarder.py's Forwarders.
"""

from __future__ import annotations

import threading

from handler.route_table import REFUSED, ROUTES, SNAPSHOT
from node.cluster_proposals import ClusterProposals
from node.core.cluster import ClusterProtocol
from node.core.effects import (AcceptWhenStored, AfterFlush, ApplyBroker, EnqueueLocal, JournalDeclare,
                               JournalRemove, JournalStore, ReadOutbound, ReadRecords, Refuse, SubmitForward)
from node.core.outbound import Entry
from node.peer.forwarder import Forwarders


class ClusterLink:
    def __init__(self, node_id: str, config, broker, journal, clock_ms, peer_tls=None):
        self.node_id = node_id
        self.peer_tls = peer_tls  # node.peer.cluster_secrets.ClusterTls: forwarders dial with it; None: plaintext
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
        # one per owner; without peer_tls the runtime gives them the cluster credential (forwarders.signer)
        self.forwarders = Forwarders(
            node_id, lambda owner: self.protocol.peer_addresses.get(owner),
            lambda owner, high_water: self.bridge.post(lambda: self.acknowledged(owner, high_water)),
            call_timeout_ms=config.forward_timeout_ms, tls=peer_tls)
        self.proposals = ClusterProposals(self)  # what the protocol asks of the grouping handler
        self.raft_decision_latency = self.proposals.decision_latency
        self._carry = {
            EnqueueLocal: self._enqueue_local, AcceptWhenStored: self._accept_when_stored,
            Refuse: self._refuse, JournalStore: self._journal_store, JournalRemove: self._journal_remove,
            JournalDeclare: self._journal_declare, ApplyBroker: self._apply_broker,
            AfterFlush: self._after_flush, SubmitForward: self._submit_forward, ReadOutbound: self._read_outbound,
            ReadRecords: self._read_records,
            **self.proposals.carry(),  # Propose*, QueueDeleted, ReportConsumers, Register, Reply, StopNode
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
        if self.proposals.claimed_ns and kind in (ROUTES, REFUSED, SNAPSHOT):
            self.proposals.decided(kind, payload)
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
        self.forwarders.to(effect.owner).submit(effect.entries, self.broker.next_seq)

    def _read_outbound(self, effect: ReadOutbound) -> None:
        for name, seqs in effect.reads:  # answered through outbound_read, on the engine loop
            self.journal.read_records(name, seqs)

    def _read_records(self, effect: ReadRecords) -> None:  # answered through cold_records, on the engine loop
        self.journal.read_records_after(effect.queue, effect.after_seq, effect.count, effect.max_bytes)

    # ---- shutdown ----------------------------------------------------------------------------

    def close(self) -> None:
        self.protocol.close()
        self.forwarders.close()
