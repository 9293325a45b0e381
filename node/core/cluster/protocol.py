"""The cluster protocol of one node: its event entry points, each delegating to one concern of the package.

Rules:
- Pure, owned by the engine loop thread. Each entry point takes `now_ms` where time matters and returns
  effects (node/core/effects.py), which the caller carries out in order: node/cluster.py with the
  server, the journal, the forwarders and the raft member; tests/sim/node_model.py with simulated ones.
- A grouped message is enqueued here only when the route of its group names this node; otherwise it goes
  to the outbound channel of its owner (forwarding.py). Either way the producer hears "accepted" only
  once the message is stored, here or in the outbound store. Where a message of a moving group goes is
  the handover's answer (handover.py `placement`).
- The top of the package: it builds the concerns; only the package's __init__ imports it. Never imports
  threading, grpc, pysyncobj, socket or time. docs/cluster-protocol.md lists the entry points.
"""

from __future__ import annotations

import collections

from node.core.dispatch.broker import Broker
from node.core.dispatch.local_changes import LocalChanges
from node.core.cluster import recovery, reroutes
from node.core.cluster import status as reports
from node.core.cluster.context import Context, Delegated, chunks
from node.core.cluster.definitions import Definitions
from node.core.cluster.owner_lease import LeaseGate
from node.core.cluster.feed import MEMBERS, MOVES, MOVES_ALL, QUEUES, QUEUES_ALL, REFUSED, REPLICAS, ROUTES, SNAPSHOT
from node.core.cluster.forwarding import SEQ_RESERVE_BLOCK, Forwarding
from node.core.cluster.handover import PARK, QUEUE, REFUSE, Handovers
from node.core.cluster.holds import Holds
from node.core.cluster.owner import OwnerSide
from node.core.cluster.parking import Parking
from node.core.cluster.routes import Routes
from node.core.cluster.takeovers import Takeovers
from node.core.effects import AcceptWhenStored, EnqueueLocal, ProposeClaim, Refuse
from node.core.dispatch.message import Message
from node.core.cluster.outbound import Entry
from node.core.cluster.routing import Router


class ClusterProtocol:
    closed = Delegated("context", "closed")
    seq_reserved = Delegated("forwarding", "seq_reserved")
    reserved_durable = Delegated("forwarding", "reserved_durable")
    members = Delegated("routing", "members")
    replicas = Delegated("routing", "replicas")  # owner epochs and in-sync backups, read-only (replicas.py)
    peer_addresses = Delegated("routing", "peer_addresses")
    registered = Delegated("routing", "registered")
    refresh_due_ms = Delegated("routing", "refresh_due_ms")
    definitions = Delegated("queue_definitions", "definitions")
    definitions_applied = Delegated("queue_definitions", "definitions_applied")
    definitions_revision = Delegated("queue_definitions", "definitions_revision")
    queue_seeds = Delegated("queue_definitions", "queue_seeds")

    def __init__(self, node_id: str, broker: Broker, *, handler_timeout_ms: int, group_timeout_ms: int = 0,
                 routes_max: int = 0, journalled: bool = True, seq_reserve_block: int = SEQ_RESERVE_BLOCK,
                 counts: collections.Counter | None = None, follows_consumers: bool = False,
                 queue_seeds: tuple = (), outbound_max_bytes: int = 0, outbound_total_max_bytes: int = 0,
                 outbound_max_messages: int = 0, outbound_memory_max_bytes: int = 0, owner_lease_ms: int = 0,
                 replication_factor_default: int = 1):
        """`queue_seeds`: the config file's queues, as settings dicts; `outbound_*`: the outbound store's
        bounds, 0 = none (forwarding.py); `follows_consumers`: route_follow_ms > 0 (every node agrees)."""
        self.node_id = node_id
        self.broker = broker
        self.router = Router(node_id, handler_timeout_ms, group_timeout_ms // 2)
        # what happened, for metrics and the simulation: resends_skipped, forwards_forgotten, reserved_again
        self.counts = counts if counts is not None else collections.Counter()
        self.context = context = Context(node_id, broker, self.router, self.counts, journalled)
        self.forwarding = Forwarding(
            context, seq_reserve_block=seq_reserve_block, outbound_max_bytes=outbound_max_bytes,
            outbound_total_max_bytes=outbound_total_max_bytes, outbound_max_messages=outbound_max_messages,
            outbound_memory_max_bytes=outbound_memory_max_bytes)
        self.parking = Parking(context, self.forwarding)
        self.holds = Holds(context)
        self.handovers = Handovers(context, self.forwarding, self.parking, self.holds)
        self.owner = OwnerSide(context, self.handovers, follows_consumers)
        self.routing = Routes(context, self.forwarding, handler_timeout_ms, routes_max)
        self.queue_definitions = definitions = Definitions(context, queue_seeds)
        # the definitions' entry points, bound: queues_seeded(), queue_seeds_failed(now_ms),
        # definition_proposed(values, reason, outcome, held, now_ms), deletion_proposed(name, reason, now_ms)
        self.queues_seeded, self.queue_seeds_failed = definitions.queues_seeded, definitions.queue_seeds_failed
        self.definition_proposed, self.deletion_proposed = definitions.definition_proposed, definitions.deletion_proposed
        self.takeovers = Takeovers(context, self.handovers, self.routing.replicas)  # promotions (issue 28)
        self.lease = LeaseGate(context, owner_lease_ms, replication_factor_default,  # the owner's lease (issue 28)
                               lambda: self.routing.replicas.epoch_of(node_id) > self.takeovers.serving_epoch)
        # the concerns' shared state, one object each (never replaced): adapters, status and tests read it
        self.outbound = self.forwarding.outbound
        self.inbound = self.owner.inbound
        self.moves = context.moves
        self.held = self.holds.held
        self.parked = self.parking.parked
        # queues made or ended here on a client's behalf (definitions.py), groups this node put messages
        # in itself (routes.py `route_entered`): the broker records them (dispatch/local_changes.py)
        broker.local = LocalChanges()

    @property
    def batch_due(self) -> bool:
        """True when the end of this batch has something to propose or forward."""
        broker, forwarding = self.broker, self.forwarding
        return bool(self.router.to_claim or forwarding.unsubmitted or forwarding.recovered or broker.local)

    # ---- recovery (before the engine loop runs) --------------------------------------------------

    def recover_declaration(self, values: dict) -> bool:
        """Take a journalled declaration that is the cluster's own; False for a queue's."""
        return self.takeovers.recover_declaration(values) or recovery.recover_declaration(
            values, self.forwarding, self.inbound, self.queue_definitions)

    def recover_outbound(self, messages_by_name: dict) -> int:
        """Put journalled outbound and parked messages back (recovery.py)."""
        return recovery.recover_outbound(messages_by_name, self.forwarding, self.parking)

    def hold_recovered(self) -> None:  # holds.py
        self.holds.hold_recovered()

    # ---- arrivals --------------------------------------------------------------------------------

    def arrive(self, incoming, queue: str, route_key: str, message: Message, durable: bool,
               producer_settled: bool, now_ms: int) -> list:
        item = (incoming, queue, route_key, message, durable, producer_settled)
        owner = self.router.route((queue, route_key), item, now_ms)
        if owner is None:
            return []
        effects: list = []
        self._send(owner, item, now_ms, effects)
        return effects

    def _send(self, owner: str, item, now_ms: int, effects: list) -> None:
        incoming, queue, route_key, message, durable, producer_settled = item
        if self.moves or self.parked or self.handovers.taking_over:
            key = (queue, route_key)
            place = self.handovers.placement(key, None, owner)
            if place == PARK:
                self.parking.park(key, message, durable, now_ms, effects)  # behind the move's handover
                effects.append(AcceptWhenStored(incoming, durable, producer_settled))
                return
            if place == REFUSE:
                effects.append(Refuse(incoming, self.handovers.refusal(key)))
                return
            if place == QUEUE:
                owner = self.node_id  # behind what the group still has here, handed over after it
        if owner == self.node_id:
            refusal = self.lease.refusal(queue)
            if refusal is not None:
                effects.append(Refuse(incoming, refusal))
                return
            effects.append(EnqueueLocal(incoming, queue, message, durable, producer_settled, now_ms))
        else:
            self.forwarding.send(owner, item, now_ms, effects)

    def _release(self, released, now_ms: int, effects: list) -> None:
        for owner, item in released:
            self._send(owner, item, now_ms, effects)

    # ---- the end of a batch of the engine loop, and the journal's answers ------------------------

    def quiesced(self, now_ms: int) -> list:
        if self.context.closed:
            return []
        effects: list = []
        local = self.broker.local
        if local.made or local.ended:  # before the claims: a queue's definition precedes its routes
            self.queue_definitions.take_made(effects)
        if local.entered:
            self.routing.route_entered(now_ms, effects)
        keys = self.router.take_claims()
        if keys:
            effects.extend(ProposeClaim(chunk, now_ms) for chunk in chunks(keys))
        self.forwarding.batch_end(effects)
        return effects

    def flushed(self, what, reason: str | None, now_ms: int) -> list:
        """What an AfterFlush waited for is on disk (reason None) or failed (the reason): its
        continuation (forwarding, owner, parking, sweep or context.MustAgree) goes on."""
        if not hasattr(what, "flushed"):
            raise AssertionError(f"flushed() was handed {what!r}, which no AfterFlush of this protocol made")
        effects: list = []
        what.flushed(reason, now_ms, effects)
        return effects

    # ---- the raft member's answers -----------------------------------------------------------

    def claim_failed(self, keys, reason: str) -> None:
        self.routing.claim_failed(keys, reason)

    def touch_failed(self, now_ms: int) -> None:
        self.routing.touch_failed(now_ms)

    def registered_now(self) -> None:  # this node's addresses are in the table
        self.routing.registered = True

    def applied(self, kind: str, payload, at_ms, now_ms: int) -> list:
        """A command the replica applied, in log order (node/core/cluster/feed.py names the kinds)."""
        effects: list = []
        if kind == ROUTES:
            taken = self.takeovers.routes_learning(payload)  # before the router forgets the old owners
            self._release(self.routing.learn(payload, at_ms, now_ms), now_ms, effects)
            self.takeovers.take_over(taken, effects)
            if self.moves:
                self.handovers.routes_removed(payload)
            if self.held:
                self.handovers.review_holds(now_ms, effects)
        elif kind == SNAPSHOT:
            self._release(self.routing.snapshot(payload, now_ms), now_ms, effects)
        elif kind == REFUSED:
            self.routing.refused(payload, effects)
        elif kind == MOVES or kind == MOVES_ALL:
            self.handovers.moves_changed(payload, snapshot=kind == MOVES_ALL)
            self.handovers.review_holds(now_ms, effects)
        elif kind == QUEUES:
            self.queue_definitions.applied(payload, effects)
        elif kind == QUEUES_ALL:
            self.queue_definitions.applied_all(payload, effects)
        elif kind == MEMBERS:
            down = self.routing.members_applied(payload)
            self.queue_definitions.delete_temporary_of(down)
        elif kind == REPLICAS:  # read-only copy: routing.replicas (replicas.py), which takeovers.py compares
            self.takeovers.replicas_applied(payload)
        return effects

    def ready(self, now_ms: int) -> list:
        """The replica has caught up with the log."""
        effects: list = []
        self.queue_definitions.ready(now_ms, set(self.members.get("down", {})), effects)
        released = self.router.become_ready(now_ms)
        self.takeovers.ready(now_ms, effects)  # fences before review_holds hands recovered groups on
        if self.held:  # first: what recovery held is older than what waited for the replica, and the
            self.handovers.review_holds(now_ms, effects)  # broker delivers it now, ahead of those effects
        self._release(released, now_ms, effects)
        return effects

    @property
    def pending_definitions(self) -> set[str]:
        """Queues whose definition or deletion this node has yet to propose, or to see committed."""
        return self.queue_definitions.pending

    # ---- timers ------------------------------------------------------------------------------

    def tick(self, now_ms: int, consumer_counts: dict[str, int]) -> list:
        """`consumer_counts`: consumers per queue on this node now (where new groups should go)."""
        if self.context.closed:
            return []
        effects: list = []
        self.routing.expire(now_ms, effects)
        self.queue_definitions.tick(now_ms, effects)
        self.routing.tick(now_ms, consumer_counts, effects)
        self.takeovers.fence(now_ms, effects)
        if self.moves or self.held or self.parked:  # parked: a new owner's, unparked once its move ended
            self.handovers.drive(now_ms, effects)
        if self.router.to_claim:
            effects.extend(self.quiesced(now_ms))
        return effects

    # ---- peers: acknowledgements, reads back, batches forwarded here ------------------------------

    def acknowledged(self, owner: str, high_water: int) -> list:
        """`owner` holds (stored) everything this node forwarded it up to `high_water`."""
        return self.forwarding.acknowledged(owner, high_water)

    def outbound_read(self, name: str, records: dict) -> list:
        return self.forwarding.outbound_read(name, records)

    def forward_received(self, source: str, entries: list[Entry], reply_to, now_ms: int, seq_bound: int = 0,
                         disputed_high_water: int = 0) -> list:
        """Enqueue a batch `source` forwarded (owner.py); the Reply comes once it is stored here."""
        refusal = next(filter(None, (self.lease.refusal(entry.queue) for entry in entries)), None)
        if refusal is not None:  # the forwarder sends it again, here or to the owner the table names then
            reply_to(0, refusal)
            return []
        return self.owner.forward_received(source, entries, reply_to, now_ms, seq_bound, disputed_high_water)

    def cold_records(self, name: str, records: dict, now_ms: int) -> list | None:
        """Records of queue `name`'s cold tail read back: a sweep's, whose effects are returned (sweep.py); None
        for the queue's own (Broker.promote takes them), whose groups living elsewhere are held first."""
        effects = self.handovers.sweeps.cold_records(name, records, now_ms)
        if effects is None:
            self.holds.hold_strays(name, records)
        return effects

    # ---- an operator's reroute (node/core/dispatch/reroute.py; the rule in reroutes.py) ------------------

    def reroute_owner(self, queue: str, route_key: str, size_bytes: int) -> str | None:
        return reroutes.owner_of(self, queue, route_key, size_bytes)

    def rerouted(self, broker_effects: list, forwards: list, now_ms: int) -> list:
        return self.forwarding.rerouted(broker_effects, forwards, now_ms)

    # ---- status and shutdown -----------------------------------------------------------------

    def in_transit(self) -> dict[str, int]:
        return reports.in_transit(self)

    def status(self) -> dict:
        return reports.status(self)

    def close(self) -> None:
        self.context.closed = True
