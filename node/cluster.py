"""The node's side of a cluster: routing arrivals, forwarding to owners, receiving forwarded batches.

Engine loop thread only, except `handle_forward`, which runs on a gRPC pool thread and enters the
engine loop through the bridge. Rules:
- A grouped message is enqueued here only when the route of its group names this node; otherwise it
  goes to the outbound channel of its owner. Either way the producer hears "accepted" only once the
  message is stored (journalled when its queue is durable), here or in the outbound store.
- The outbound store is the journal: each forwarded message is a STORE under a reserved name
  (OUTBOUND_PREFIX owner NUL queue) until its owner acknowledges it, then a REMOVE.
- Forward seqs are node seqs. They must never repeat after a restart, or an owner would take new
  messages for resends: blocks of seqs are reserved in the journal before use.
- An owner records, per source node, the highest forward seq it has enqueued (a MARK_PREFIX
  declaration journalled after the messages), so a resend after a lost acknowledgement is skipped.
"""

from __future__ import annotations

import collections
import logging
import threading

from handler import replicated
from node.core.errors import GrouperError, HandlerUnavailable, ResourceLimitExceeded
from node.core.message import Message
from node.core.routing import Inbound, Outbound, Router
from node.peer.forwarder import Entry, Forwarder

log = logging.getLogger("grouper.cluster")

OUTBOUND_PREFIX = "\x00out\x00"  # journal name of an outbound channel: prefix, owner, NUL, queue
MARK_PREFIX = "\x00mark\x00"  # journal declaration holding a source's high-water forward seq
SEQ_RESERVATION = "\x00seq"  # journal declaration: node seqs below "reserved" may have been used
SEQ_RESERVE_BLOCK = 1 << 20  # seqs reserved per journal record
STORED = "stored"  # outcome of a journal batch written to disk
CLAIM_KEYS_MAX = 1000  # keys per raft command; a larger batch is split
CLAIM_RETRY_INTERVAL_MS = 100  # a failed proposal (no leader yet) is retried at the next tick after this
CONSUMER_REPORT_INTERVAL_MS = 5000  # consumer counts are re-reported this often even unchanged
REGISTER_RETRY_INTERVAL_MS = 1000  # until this node's addresses are in the table


def outbound_name(owner: str, queue: str) -> str:
    return f"{OUTBOUND_PREFIX}{owner}\x00{queue}"


def parse_outbound_name(name: str) -> tuple[str, str]:
    owner, _, queue = name[len(OUTBOUND_PREFIX):].partition("\x00")
    return owner, queue


class ClusterLink:
    def __init__(self, node_id: str, config, broker, journal, clock_ms):
        self.node_id = node_id
        self.config = config
        self.broker = broker
        self.journal = journal
        self.clock_ms = clock_ms
        self.server = self.handler = self.bridge = None  # attached at start, after recovery
        self.addresses: dict[str, str] = {}  # this node's peer_address, amqp_address, admin_address
        lease_ms = config.group_timeout_ms // 2
        self.router = Router(node_id, config.handler_timeout_ms, lease_ms)
        self.outbound = Outbound()
        self.inbound = Inbound()
        self.members: dict = {"nodes": {}, "consumers": {}, "down": {}}
        self.peer_addresses: dict[str, str] = {}  # replaced whole, never mutated: forwarders read it
        self.seq_reserved = 0
        self._unsubmitted: dict[str, list[Entry]] = {}  # this batch's new outbound entries, per owner
        self._recovered: dict[str, list[Entry]] = {}  # journalled before a restart: durable already
        self._reserved_durable = 0  # the highest seq reservation known to be on disk
        self._batch_reservation = 0  # the reservation journalled in the current batch, if any
        self._flushing: collections.deque = collections.deque()  # [batch, reservation, outcome], journal order
        self._reserving = False  # a reservation covering flushed batches is on its way to disk
        self._inbound_durable: dict[str, int] = {}  # source node -> high water known to be on disk here
        self._forwarders: dict[str, Forwarder] = {}
        self._retry_claims: list = []
        self._retry_due_ms = 0
        self._reported: dict | None = None
        self._report_due_ms = 0
        self.registered = False
        self._register_due_ms = 0
        self._refresh_due_ms = 0
        self.closed = False

    def attach(self, server, handler, bridge, addresses: dict[str, str]) -> None:
        self.server, self.handler, self.bridge, self.addresses = server, handler, bridge, addresses

    # ---- recovery (before the engine loop runs) --------------------------------------------------

    def recover_declaration(self, values: dict) -> bool:
        """Take a journalled declaration that is the cluster's own; False for a queue's."""
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
        """Put journalled outbound messages back in their channels, in seq order."""
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

    # ---- arrivals ----------------------------------------------------------------------------

    def arrive(self, delivery, queue: str, route_key: str, message: Message, durable: bool,
               producer_settled: bool, now_ms: int) -> None:
        item = (delivery, queue, route_key, message, durable, producer_settled)
        owner = self.router.route((queue, route_key), item, now_ms)
        if owner is not None:
            self._send(owner, item, now_ms)

    def _send(self, owner: str, item, now_ms: int) -> None:
        delivery, queue, route_key, message, durable, producer_settled = item
        if owner == self.node_id:
            self.server.enqueue_local(delivery, queue, message, durable, producer_settled, now_ms)
            return
        message.seq = self.broker.allocate_seq()
        message.enqueued_at_ms = message.enqueued_at_ms or now_ms
        journal_name = None
        if durable and self.journal is not None:
            self._reserve_seq(message.seq)
            journal_name = outbound_name(owner, queue)
            self.journal.store(journal_name, message)
        self.outbound.add(owner, message.seq, (queue, route_key), journal_name)
        self._unsubmitted.setdefault(owner, []).append(_entry(queue, message))
        self.server.accept_when_stored(delivery, durable, producer_settled)

    def _reserve_seq(self, seq: int) -> None:
        if seq < self.seq_reserved:
            return
        self.seq_reserved = self._batch_reservation = seq + SEQ_RESERVE_BLOCK
        self.journal.declare({"name": SEQ_RESERVATION, "reserved": self.seq_reserved})

    def _release(self, released, now_ms: int) -> None:
        for owner, item in released:
            self._send(owner, item, now_ms)

    # ---- end of a batch of the engine loop --------------------------------------------------------------

    def quiesced(self) -> None:
        if self.closed:
            return
        keys = self.router.take_claims()
        if keys:
            self._propose(keys, self.clock_ms())
        if self._recovered:
            recovered, self._recovered = self._recovered, {}
            for owner, entries in recovered.items():
                self._forwarder(owner).submit(entries)
        if self._unsubmitted:
            # forwarded only once this batch is on disk here, and only under a seq reservation
            # known to be on disk, so a crash can never make this node reuse a forward seq an
            # owner has already seen; batches leave in journal order
            batch, self._unsubmitted = self._unsubmitted, {}
            # only this batch's own reservation is proven on disk when the batch is
            reserved, self._batch_reservation = self._batch_reservation, 0
            flushing = [batch, reserved, None]
            self._flushing.append(flushing)
            self.server.after_flush(lambda reason: self._flushed(flushing, reason))

    def _flushed(self, flushing: list, reason) -> None:
        flushing[2] = reason or STORED
        self._reservation_flushed(flushing[1], reason)

    def _reservation_flushed(self, reserved: int, reason) -> None:
        if reason is None:
            self._reserved_durable = max(self._reserved_durable, reserved)
        else:  # the reservation may be lost with the batch: the next outbound message journals one
            self.seq_reserved = self._reserved_durable
        self._forward_flushed()

    def _forward_flushed(self) -> None:
        while self._flushing and not self.closed:
            batch, _, outcome = self._flushing[0]
            if outcome is None:
                return  # not on disk yet; later batches wait behind it
            if outcome is not STORED:
                # the producers were refused: these messages must not reach their owners
                for owner, entries in batch.items():
                    self.outbound.forget(owner, [entry.forward_seq for entry in entries])
            else:
                top_seq = max(entry.forward_seq for entries in batch.values() for entry in entries)
                if top_seq >= self._reserved_durable:
                    # a failed batch took the reservation these seqs were given under: reserve again
                    if not self._reserving:
                        self._reserving = True
                        self.seq_reserved = self._reserved_durable
                        self._reserve_seq(self.broker.next_seq)  # above every seq handed out so far
                        reserved, self._batch_reservation = self._batch_reservation, 0
                        self.server.after_flush(lambda reason: self._reserved_again(reserved, reason))
                    return
                for owner, entries in batch.items():
                    self._forwarder(owner).submit(entries)
            self._flushing.popleft()

    def _reserved_again(self, reserved: int, reason) -> None:
        self._reserving = False
        self._reservation_flushed(reserved, reason)

    def _propose(self, keys: list, now_ms: int) -> None:
        for chunk in _chunks(keys):
            self.handler.claim(chunk, now_ms, on_failed=self._claim_failed_elsewhere)

    def _claim_failed_elsewhere(self, keys, reason: str) -> None:  # tick thread
        self.bridge.post(lambda: self._claim_failed(keys, reason))

    def _claim_failed(self, keys, reason: str) -> None:
        log.debug("route proposal for %d groups failed (%s); retrying", len(keys), reason)
        self._retry_claims.extend(keys)

    def _forwarder(self, owner: str) -> Forwarder:
        forwarder = self._forwarders.get(owner)
        if forwarder is None:
            forwarder = Forwarder(
                self.node_id, owner,
                resolve_address=lambda: self.peer_addresses.get(owner),
                on_acked=lambda high_water: self.bridge.post(lambda: self.acknowledged(owner, high_water)),
                call_timeout_ms=self.config.forward_timeout_ms)
            self._forwarders[owner] = forwarder
        return forwarder

    def acknowledged(self, owner: str, high_water: int) -> None:
        for journal_name, seq in self.outbound.acknowledge(owner, high_water):
            if self.journal is not None:
                self.journal.remove(journal_name, seq)

    # ---- the handler's applied commands (arrive through the bridge, in log order) ------------

    def applied(self, kind: str, payload, at_ms) -> None:
        now_ms = self.clock_ms()
        if kind == replicated.ROUTES:
            # a route's lease runs from the refresh time in the log, not from when this node heard
            # of it: a node replaying an old log must not think old routes fresh
            self._release(self.router.learn(payload, now_ms if at_ms is None else at_ms, now_ms), now_ms)
        elif kind == replicated.SNAPSHOT:
            fresh = {(queue, group) for queue, group, _, _ in payload}
            gone = [(queue, group, None) for queue, group in self.router.routes if (queue, group) not in fresh]
            released = self.router.learn(gone, now_ms)
            for queue, group, owner, touched_ms in payload:
                released += self.router.learn([(queue, group, owner)], touched_ms, now_ms)
            self._release(released, now_ms)
        elif kind == replicated.REFUSED:
            for key in payload:
                for item in self.router.give_up(tuple(key)):
                    self.server.refuse(item[0], ResourceLimitExceeded(
                        f"the cluster routes at most {self.config.routes_max} groups (routes_max); group "
                        f"{key[1]!r} of queue {key[0]!r} has no route; retry once groups drain"))
        elif kind == replicated.MEMBERS:
            for node in sorted(set(payload["down"]) - set(self.members["down"])):
                log.warning("node %s is marked down by the owner-failover policy; its groups are placed afresh%s",
                            node, " (this node!)" if node == self.node_id else "")
            self.members = payload
            self.peer_addresses = {node: info.get("peer_address", "") for node, info in payload["nodes"].items()}

    def ready(self) -> None:
        now_ms = self.clock_ms()
        self._release(self.router.become_ready(now_ms), now_ms)

    # ---- timers ------------------------------------------------------------------------------

    def tick(self, now_ms: int) -> None:
        if self.closed:
            return
        for item in self.router.expire(now_ms):
            self.server.refuse(item[0], HandlerUnavailable(
                f"no route for this message's group could be decided within {self.config.handler_timeout_ms} ms "
                f"(handler_timeout_ms): the grouping handler (the raft leader) is unavailable, is a majority "
                f"of the cluster's nodes up? The message was not enqueued; send it again later"))
        if self._retry_claims and now_ms >= self._retry_due_ms:
            self.router.claim_failed(self._retry_claims)
            self._retry_claims = []
            self._retry_due_ms = now_ms + CLAIM_RETRY_INTERVAL_MS
        counts = self.server.consumer_counts()
        if counts != self._reported or now_ms >= self._report_due_ms:
            self.handler.report_consumers(counts, now_ms)
            self._reported = counts
            self._report_due_ms = now_ms + CONSUMER_REPORT_INTERVAL_MS
        if not self.registered and now_ms >= self._register_due_ms:
            self._register_due_ms = now_ms + REGISTER_RETRY_INTERVAL_MS
            self.handler.register(self.addresses["peer_address"], self.addresses["amqp_address"],
                                  self.addresses["admin_address"], now_ms, on_done=self._registered_elsewhere)
        if self.router.lease_ms and now_ms >= self._refresh_due_ms:
            self._refresh_due_ms = now_ms + self.router.lease_ms // 2
            self._refresh_leases(now_ms)
        if self.router.to_claim:
            self.quiesced()

    def _registered_elsewhere(self, error) -> None:  # tick thread
        if error is None:
            self.bridge.post(lambda: setattr(self, "registered", True))

    def _refresh_leases(self, now_ms: int) -> None:
        # a route expires only when no node uses it: refresh what this node routed lately, what it
        # holds as owner and what waits in its outbound channels, each naming the node it relies on
        # (a touch makes a missing route again there, never elsewhere)
        entries = {key: self.router.routes[key] for key in self.router.take_used() if key in self.router.routes}
        entries.update(self.outbound.owners_by_key())
        for name, queue in self.broker.queues.items():
            if queue.settings.grouping:
                entries.update(((name, key), self.node_id) for key in queue.busy_route_keys())
        if not entries:
            return
        touches = [(queue, group, node) for (queue, group), node in sorted(entries.items())]
        for chunk in _chunks(touches):
            self.handler.touch(chunk, now_ms, on_failed=self._touch_failed)

    def _touch_failed(self, entries, reason: str) -> None:  # tick thread
        log.info("refreshing %d routes failed (%s); retrying in %d ms", len(entries), reason,
                 CLAIM_RETRY_INTERVAL_MS * 10)
        self.bridge.post(self._refresh_soon)

    def _refresh_soon(self) -> None:
        self._refresh_due_ms = min(self._refresh_due_ms, self.clock_ms() + CLAIM_RETRY_INTERVAL_MS * 10)

    # ---- owner side: batches forwarded by other nodes ----------------------------------------

    def handle_forward(self, source: str, entries: list[Entry], timeout_ms: int) -> int:
        """gRPC pool thread: enqueue a forwarded batch and return once it is stored here."""
        done = threading.Event()
        outcome: dict = {}

        def finished(reason):
            outcome["reason"] = reason
            done.set()

        def run():
            try:
                outcome["high_water"] = high_water = self._enqueue_forwarded(source, entries)
            except GrouperError as error:
                outcome["error"] = error
                done.set()
                return

            def stored(reason):
                if reason is None:
                    self._inbound_durable[source] = max(self._inbound_durable.get(source, 0), high_water)
                else:
                    # not on disk: go back to what is, so the resend is taken again, not skipped
                    self.inbound.high_water[source] = self._inbound_durable.get(source, 0)
                finished(reason)
            self.server.after_flush(stored)

        self.bridge.post(run)
        if not done.wait(timeout_ms / 1000):
            raise TimeoutError(f"the owner did not store the batch within {timeout_ms} ms")
        if "error" in outcome:
            raise outcome["error"]
        if outcome["reason"] is not None:
            raise ResourceLimitExceeded(f"the owner could not store the batch: {outcome['reason']}; retry later")
        return outcome["high_water"]

    def _enqueue_forwarded(self, source: str, entries: list[Entry]) -> int:
        now_ms = self.clock_ms()
        inbound = self.inbound
        advanced = False
        for entry in entries:
            if not inbound.fresh(source, entry.forward_seq):
                continue  # a resend of what is already here
            message = Message(entry.payload, entry.group_id, expires_at_ms=entry.expires_at_ms,
                              closes_group=entry.closes_group, enqueued_at_ms=entry.enqueued_at_ms)
            try:
                effects = self.broker.enqueue(entry.queue, message, now_ms)
            except GrouperError as error:
                if not advanced:
                    raise
                log.info("forwarded batch from %s stopped at seq %d: %s", source, entry.forward_seq,
                         error.description)
                break
            inbound.advance(source, entry.forward_seq)
            advanced = True
            self.server.apply(effects)
        high_water = inbound.high_water.get(source, 0)
        if advanced and self.journal is not None:
            self.journal.declare({"name": MARK_PREFIX + source, "high_water": high_water})
        return high_water

    # ---- status and shutdown -----------------------------------------------------------------

    def status(self) -> dict:
        return {
            "routes": len(self.router.routes),
            "waiting_for_route": self.router.waiting_count(),
            "outbound": self.outbound.depths(),
            "members": self.members,
        }

    def close(self) -> None:
        self.closed = True
        for forwarder in self._forwarders.values():
            forwarder.close()


def _chunks(items: list) -> list[list]:
    """Raft commands of at most CLAIM_KEYS_MAX keys each."""
    return [items[start:start + CLAIM_KEYS_MAX] for start in range(0, len(items), CLAIM_KEYS_MAX)]


def _entry(queue: str, message: Message) -> Entry:
    return Entry(message.seq, queue, message.group_id, bytes(message.payload), message.expires_at_ms or 0,
                 message.closes_group, message.enqueued_at_ms or 0)
