"""The cluster adapter's proposals: what the cluster protocol asks of the grouping handler, and the answers back.

Rules:
- A collaborator of node/cluster.py's ClusterLink, which hands it the protocol's Propose* effects,
  ReportConsumers, Register and QueueDeleted, the Reply to a batch forwarded here, and StopNode.
- Engine loop thread, except the handler's outcome callbacks (`done`, `*_elsewhere`), which run on
  the raft member channel's reader thread and only post to the engine loop through the bridge; the
  protocol hears each outcome there (claim_failed, touch_failed, definition_proposed, ...), and its
  effects go back through `carry_out`, the ClusterLink's.
- A lost proposal is proposed again by the protocol at a later tick; nothing here retries.
- Raft decisions are timed per group from this node's claim to its route arriving here, in
  nanoseconds (the pure core's clock counts whole ms, too coarse for a 5 ms target); at most
  DECISIONS_TIMED_MAX claims are timed at once, the rest pass untimed.
- A StopNode ends the process at once (exit EXIT_STOPPED), for the supervisor to restart it.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Callable

from node.core.cluster.feed import ROUTES
from node.core.cluster.routes import TOUCH_RETRY_INTERVAL_MS
from node.core.effects import (ProposeClaim, ProposeDefinition, ProposeMoveClear, ProposeQueueDeletion,
                               ProposeQueueSeeds, ProposeTouch, QueueDeleted, Register, Reply, ReportConsumers,
                               StopNode)
from node.core.tally import DECISION_BOUNDS_MS, LatencyTally

log = logging.getLogger("grouper.cluster")

EXIT_STOPPED = 70  # the exit status of a StopNode, as of the engine loop's stop on a broken invariant
DECISIONS_TIMED_MAX = 100_000  # claims timed at once (see the header)


class ClusterProposals:
    def __init__(self, link):
        """`link`: the ClusterLink: its protocol, handler, bridge, server, journal, addresses, clock_ms
        and carry_out (the handler, bridge and server are attached after recovery)."""
        self.link = link
        self.claimed_ns: dict[tuple, int] = {}  # (queue, group) -> when this node proposed its claim
        self.decision_latency = LatencyTally(DECISION_BOUNDS_MS)

    def carry(self) -> dict[type, Callable]:
        """The effects this carries out, by type: the ClusterLink's rows for them."""
        return {
            ProposeClaim: self.propose_claim, ProposeTouch: self.propose_touch,
            ProposeMoveClear: self.propose_move_clear, ProposeQueueSeeds: self.propose_queue_seeds,
            QueueDeleted: self.queue_deleted, ProposeDefinition: self.propose_definition,
            ProposeQueueDeletion: self.propose_queue_deletion, ReportConsumers: self.report_consumers,
            Register: self.register, Reply: self.reply, StopNode: self.stop,
        }

    # ---- routes ----------------------------------------------------------------------------------

    def propose_claim(self, effect: ProposeClaim) -> None:
        if len(self.claimed_ns) < DECISIONS_TIMED_MAX:
            claimed_ns = time.monotonic_ns()
            for queue, group in effect.keys:
                self.claimed_ns.setdefault((queue, group), claimed_ns)
        self.link.handler.claim(effect.keys, effect.now_ms, on_failed=self._claim_failed_elsewhere)

    def _claim_failed_elsewhere(self, keys, reason: str) -> None:  # raft member channel thread
        self.link.bridge.post(lambda: self._claim_failed(keys, reason))

    def _claim_failed(self, keys, reason: str) -> None:
        for queue, group in keys:
            self.claimed_ns.pop((queue, group), None)
        self.link.protocol.claim_failed(keys, reason)

    def decided(self, kind: str, payload) -> None:
        """Time the claims this node made whose routes arrived; forget those refused or caught up on
        by a snapshot (no decision of theirs was seen here)."""
        decided_ns = time.monotonic_ns()
        claimed_ns, tally = self.claimed_ns, self.decision_latency
        for entry in payload:
            since_ns = claimed_ns.pop((entry[0], entry[1]), None)
            if since_ns is not None and kind == ROUTES and entry[2] is not None:
                tally.observe((decided_ns - since_ns) / 1e6)

    def propose_touch(self, effect: ProposeTouch) -> None:
        self.link.handler.touch(effect.entries, effect.now_ms, on_failed=self._touch_failed_elsewhere)

    def _touch_failed_elsewhere(self, entries, reason: str) -> None:  # raft member channel thread
        log.info("refreshing %d routes failed (%s); retrying in %d ms", len(entries), reason,
                 TOUCH_RETRY_INTERVAL_MS)
        link = self.link
        link.bridge.post(lambda: link.protocol.touch_failed(link.clock_ms()))

    def propose_move_clear(self, effect: ProposeMoveClear) -> None:
        self.link.handler.move_clear(effect.entries)  # a lost one is proposed again at a later tick

    def report_consumers(self, effect: ReportConsumers) -> None:
        self.link.handler.report_consumers(effect.counts, effect.now_ms)

    # ---- queue definitions -------------------------------------------------------------------

    def propose_queue_seeds(self, effect: ProposeQueueSeeds) -> None:
        link = self.link
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
                    link.bridge.post(lambda: link.protocol.queue_seeds_failed(link.clock_ms()))
                else:
                    link.bridge.post(link.protocol.queues_seeded)
        for values in effect.seeds:
            link.handler.define_queue(values, True, lambda reason, result, name=values["name"]: done(reason, result, name))

    def propose_definition(self, effect: ProposeDefinition) -> None:
        link, values = self.link, effect.values
        protocol = link.protocol

        def done(reason, result):  # raft member channel thread
            outcome, held = (result[0], result[1]) if reason is None else (None, None)
            link.bridge.post(lambda: link.carry_out(protocol.definition_proposed(
                values, reason, outcome, held, link.clock_ms())))
        link.handler.define_queue(values, False, done)

    def propose_queue_deletion(self, effect: ProposeQueueDeletion) -> None:
        link, name = self.link, effect.name
        protocol = link.protocol

        def done(reason, _result):  # raft member channel thread
            link.bridge.post(lambda: link.carry_out(protocol.deletion_proposed(name, reason, link.clock_ms())))
        link.handler.delete_queue(name, effect.seen_revision, done)

    def queue_deleted(self, effect: QueueDeleted) -> None:
        link = self.link
        link.server.detach_producers_of(effect.queue)
        if effect.durable and link.journal is not None:
            link.journal.delete(effect.queue)

    # ---- membership, replies, stopping --------------------------------------------------------

    def register(self, effect: Register) -> None:
        addresses = self.link.addresses
        self.link.handler.register(addresses["peer_address"], addresses["amqp_address"], addresses["admin_address"],
                                   effect.now_ms, on_done=self._registered_elsewhere)

    def _registered_elsewhere(self, error) -> None:  # raft member channel thread
        if error is None:
            self.link.bridge.post(self.link.protocol.registered_now)

    @staticmethod
    def reply(effect: Reply) -> None:
        effect.reply_to(effect.high_water, effect.error)

    def stop(self, effect: StopNode) -> None:
        self.stop_node(effect.reason)

    @staticmethod
    def stop_node(reason: str) -> None:
        """Any thread. At once, as the engine loop stops on a broken invariant: a clean shutdown would
        go on serving, while it drains, messages the journal does not hold (or, without its raft
        member, groups it cannot route)."""
        log.critical("stopping the node: %s; the supervisor restarts it and it recovers from its journal", reason)
        logging.shutdown()
        os._exit(EXIT_STOPPED)
