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
The replica writer (node/store/replica_writer.py, issue 28) is this link's too: the replica journals this
node keeps as a backup, under <data_dir>/replicas; started when attached, closed with the link; the peer
servicer's Replicate hands it batches on gRPC pool threads, as Forward hands `handle_forward` its own.
"""

from __future__ import annotations

import logging
import threading
import time

from node.cluster_proposals import ClusterProposals
from node.cluster_takeovers import TakeoverLink
from node.core.cluster import ClusterProtocol
from node.core.cluster.feed import REFUSED, REPLICAS, ROUTES, SNAPSHOT
from node.core.effects import ReadOutbound, SubmitForward
from node.core.cluster.outbound import Entry
from node.peer.forwarder import Forwarders
from node.replication_link import ReplicationLink
from node.store.replica_writer import ReplicaWriter

log = logging.getLogger("grouper.cluster")


class ClusterLink:
    def __init__(self, node_id: str, config, broker, journal, clock_ms, peer_tls=None):
        self.node_id = node_id
        self.peer_tls = peer_tls  # node.peer.cluster_secrets.ClusterTls: forwarders dial with it; None: plaintext
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
            outbound_memory_max_bytes=config.outbound_memory_max_bytes, owner_lease_ms=config.replica_lease_ms,
            replication_factor_default=config.replication_factor)
        self._contact_asked = False  # a leader_contact question is out (one at a time: a paused member answers none)
        # one per owner; without peer_tls the runtime gives them the cluster credential (forwarders.signer)
        self.forwarders = Forwarders(
            node_id, lambda owner: self.protocol.peer_addresses.get(owner),
            lambda owner, high_water: self.bridge.post(lambda: self.acknowledged(owner, high_water)),
            call_timeout_ms=config.forward_timeout_ms, tls=peer_tls)
        self.proposals = ClusterProposals(self)  # what the protocol asks of the grouping handler
        self.replicas = ReplicaWriter(config.data_dir, node_id, fsync=config.journal_fsync,
                                      compact_min_bytes=config.journal_compact_min_bytes)
        self.raft_decision_latency = self.proposals.decision_latency
        self.replication = ReplicationLink(self)  # the owner's replica streams to its backups (issue 28)
        # the cluster's rows of the server's one effect table (node/amqp/executor.py); the node shell
        # handles the protocol's sends and turns its journal effects into the broker's
        self._carry = {
            SubmitForward: self._submit_forward, ReadOutbound: self._read_outbound,
            **self.proposals.carry(),  # Propose*, QueueDeleted, ReportConsumers, Register, Reply, StopNode
            **TakeoverLink(self).carry(),  # ReadReplica, DropReplica: a promotion's takeover (issue 28)
        }

    def attach(self, server, handler, bridge, addresses: dict[str, str]) -> None:
        self.server, self.handler, self.bridge, self.addresses = server, handler, bridge, addresses
        self.shell = server.shell
        self.shell.protocol = self.protocol
        server.carry.update(self._carry)
        self.replication.attach(server)
        self.replicas.start()

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
        if self.proposals.claimed_ns and kind in (ROUTES, REFUSED, SNAPSHOT):
            self.proposals.decided(kind, payload)
        if kind == REPLICAS:  # the writer refuses an owner's batches of an epoch raft replaced (a fenced owner's)
            self.replicas.know_epochs(payload.get("epochs", {}))
        self.carry_out(self.protocol.applied(kind, payload, at_ms, self.clock_ms()))

    def ready(self) -> None:
        self.carry_out(self.protocol.ready(self.clock_ms()))

    def tick(self, now_ms: int) -> None:
        self.carry_out(self.protocol.tick(now_ms, self.server.consumer_counts()))
        self._review_lease(now_ms)  # after the protocol's tick, which fences groups lost to a promotion first
        self.replication.tick(now_ms)

    def _review_lease(self, now_ms: int) -> None:
        """The owner's lease (node/core/cluster/owner_lease.py), on the monotonic clock: ask the raft member
        when it last heard from the leader, counted from when the question was sent; review the lease."""
        monotonic_ms = int(time.monotonic() * 1000)
        if not self._contact_asked:
            self._contact_asked = True
            self.handler.leader_contact(lambda reason, age_ms: self.bridge.post(
                lambda: self._contact_answered(monotonic_ms, age_ms)))
        effects: list = []
        change = self.protocol.lease.review(monotonic_ms, now_ms, effects)
        if change:
            log.warning("owner lease LAPSED: no word from the raft leader for replica_lease_ms=%d ms; replicated "
                        "queues deliver nothing and refuse sends until it is heard from", self.config.replica_lease_ms)
        elif change is False:
            log.info("owner lease held: the raft leader is heard from; replicated queues serve")
        if effects:
            self.carry_out(effects)

    def _contact_answered(self, sent_ms: int, age_ms) -> None:
        self._contact_asked = False
        if age_ms is not None:
            self.protocol.lease.contacted(sent_ms, age_ms)

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
        self.forwarders.to(effect.owner).submit(effect.entries, self.broker.next_seq)

    def _read_outbound(self, effect: ReadOutbound) -> None:
        for name, seqs in effect.reads:  # answered through outbound_read, on the engine loop
            self.journal.read_records(name, seqs)

    # ---- shutdown ----------------------------------------------------------------------------

    def close(self) -> None:
        self.protocol.close()
        self.forwarders.close()
        self.replication.close()
        self.replicas.close()
