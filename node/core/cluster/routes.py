"""Routes: what this node learns of the route table (routes, refusals, members, owner epochs and in-sync
backups) and what it proposes to it (claims, touches that keep routes alive, consumer counts, its own
addresses).

Rules:
- A grouped message is enqueued here only when the route of its group names this node; a message
  waiting for a route is refused after handler_timeout_ms (the raft leader is unavailable).
- A route's lease runs from the refresh time in the log, not from when this node heard of it: a node
  replaying an old log must not think old routes fresh.
- A route expires only when no node uses it: this node touches what it routed lately, what it holds as
  owner, what waits in its outbound channels and its moving groups, each naming the node it relies on.
- Groups this node put messages in itself (the broker's `entered`: an admin `group move`, a dead letter)
  came by no route: a touch naming this node makes their route at the end of the batch; a group whose
  route names another node keeps it, logged.
- Failed proposals are retried at a tick: claims after CLAIM_RETRY_INTERVAL_MS, touches after
  TOUCH_RETRY_INTERVAL_MS, registration every REGISTER_RETRY_INTERVAL_MS until the table holds it.
- The owner epochs and in-sync backups are a read-only copy (replicas.py), replaced by each REPLICAS.
- Imports context, forwarding and replicas of this package.
"""

from __future__ import annotations

import logging

from node.core.cluster.context import Context, chunks
from node.core.cluster.forwarding import Forwarding
from node.core.cluster.replicas import Replicas
from node.core.effects import ProposeTouch, Refuse, Register, ReportConsumers
from node.core.errors import HandlerUnavailable, ResourceLimitExceeded

log = logging.getLogger("grouper.cluster")

CLAIM_RETRY_INTERVAL_MS = 100  # a failed proposal (no leader yet) is retried at the next tick after this
TOUCH_RETRY_INTERVAL_MS = CLAIM_RETRY_INTERVAL_MS * 10  # a failed refresh is tried again this soon
CONSUMER_REPORT_INTERVAL_MS = 5000  # consumer counts are re-reported this often even unchanged
REGISTER_RETRY_INTERVAL_MS = 1000  # until this node's addresses are in the table


class Routes:
    def __init__(self, context: Context, forwarding: Forwarding, handler_timeout_ms: int, routes_max: int):
        self.context = context
        self.router = context.router
        self.forwarding = forwarding
        self.handler_timeout_ms = handler_timeout_ms
        self.routes_max = routes_max  # for the refusal's text only: the table enforces it
        self.members: dict = {"nodes": {}, "consumers": {}, "down": {}}
        self.peer_addresses: dict[str, str] = {}  # replaced whole, never mutated: forwarders read it
        self.replicas = Replicas()  # the owner epochs and in-sync backups, as the table says (issue 28)
        self.registered = False
        self.retry_claims: list = []
        self.retry_due_ms = 0
        self.reported: dict | None = None
        self.report_due_ms = 0
        self.register_due_ms = 0
        self.refresh_due_ms = 0  # when the routes this node relies on are refreshed next (lease only)

    # ---- the feed: returns the items waiting for a route that may go now -------------------------------

    def learn(self, payload, at_ms, now_ms: int) -> list:
        """ROUTES"""
        return self.router.learn(payload, now_ms if at_ms is None else at_ms, now_ms)

    def snapshot(self, payload, now_ms: int) -> list:
        """SNAPSHOT: the whole table replaces what was known."""
        router = self.router
        fresh = {(queue, group) for queue, group, _, _ in payload}
        gone = [(queue, group, None) for queue, group in router.routes if (queue, group) not in fresh]
        released = router.learn(gone, now_ms)
        for queue, group, owner, touched_ms in payload:
            released += router.learn([(queue, group, owner)], touched_ms, now_ms)
        return released

    def refused(self, payload, effects: list) -> None:
        """REFUSED: groups the table had no room for."""
        lease_ms = self.router.lease_ms
        for key in payload:
            for item in self.router.give_up(tuple(key)):
                effects.append(Refuse(item[0], ResourceLimitExceeded(
                    f"the cluster holds {self.routes_max} live routes (routes_max), so group {key[1]!r} of "
                    f"queue {key[0]!r} got none and the message was not enqueued; "
                    + (f"a route no node used, holds messages of or has an owner of expires after "
                       f"{lease_ms * 2} ms (group_timeout_ms): send it again then, or raise "
                       f"routes_max on every node" if lease_ms else
                       "routes never expire with group_timeout_ms 0: set it (and restart the nodes), "
                       "or raise routes_max on every node"))))

    def members_applied(self, payload: dict) -> set:
        """MEMBERS; returns the nodes marked down."""
        down = payload.get("down", {})
        for node in sorted(set(down) - set(self.members.get("down", {}))):
            log.warning("node %s is marked down (owner failover: its groups are placed afresh; or a promotion: "
                        "they go to their in-sync backups)%s", node, " (this node!)" if node == self.context.node_id
                        else "")
        self.members = payload
        self.peer_addresses = {node: info.get("peer_address", "")
                               for node, info in payload.get("nodes", {}).items()}
        return set(down)

    # ---- the raft member's answers ----------------------------------------------------------------------

    def claim_failed(self, keys, reason: str) -> None:
        """A claim proposal failed (no leader yet, leader changed): retried at a tick."""
        log.debug("route proposal for %d groups failed (%s); retrying", len(keys), reason)
        self.retry_claims.extend(keys)

    def touch_failed(self, now_ms: int) -> None:
        self.refresh_due_ms = min(self.refresh_due_ms, now_ms + TOUCH_RETRY_INTERVAL_MS)

    # ---- proposals -----------------------------------------------------------------------------------

    def expire(self, now_ms: int, effects: list) -> None:
        for item in self.router.expire(now_ms):
            effects.append(Refuse(item[0], HandlerUnavailable(
                f"no route for this message's group could be decided within {self.handler_timeout_ms} ms "
                f"(handler_timeout_ms): the grouping handler (the raft leader) is unavailable, is a majority "
                f"of the cluster's nodes up? The message was not enqueued; send it again later")))

    def tick(self, now_ms: int, consumer_counts: dict[str, int], effects: list) -> None:
        if self.retry_claims and now_ms >= self.retry_due_ms:
            self.router.claim_failed(self.retry_claims)
            self.retry_claims = []
            self.retry_due_ms = now_ms + CLAIM_RETRY_INTERVAL_MS
        if consumer_counts != self.reported or now_ms >= self.report_due_ms:
            effects.append(ReportConsumers(consumer_counts, now_ms))
            self.reported = consumer_counts
            self.report_due_ms = now_ms + CONSUMER_REPORT_INTERVAL_MS
        if not self.registered and now_ms >= self.register_due_ms:
            self.register_due_ms = now_ms + REGISTER_RETRY_INTERVAL_MS
            effects.append(Register(now_ms))
        if self.router.lease_ms and now_ms >= self.refresh_due_ms:
            self.refresh_due_ms = now_ms + self.router.lease_ms // 2
            self._refresh_leases(now_ms, effects)

    def _refresh_leases(self, now_ms: int, effects: list) -> None:
        # a route expires only when no node uses it: refresh what this node routed lately, what it
        # holds as owner and what waits in its outbound channels, each naming the node it relies on
        # (a touch makes a missing route again there, never elsewhere). A cold tail's groups are not
        # known until it is read back (node/core/dispatch/cold.py): every route of its queue naming this node is
        # refreshed while it has one
        context = self.context
        routes = self.router.routes
        entries = {key: routes[key] for key in self.router.take_used() if key in routes}
        entries.update(self.forwarding.outbound.owners_by_key())
        # a moving group's route is spared while the move lasts, but must not be found idle when it ends
        # (one end may have stopped and held it up past the group timeout): both ends keep it fresh
        me = context.node_id
        entries.update((key, routes.get(key, move[1])) for key, move in context.moves.items()
                       if me in (move[0], move[1]))
        for name, queue in context.broker.queues.items():
            if queue.settings.grouping:
                entries.update(((name, key), me) for key in queue.busy_route_keys())
                if queue.cold is not None and queue.cold.count:
                    entries.update(((name, group), me) for group in routes.groups_of(name, me))
        if not entries:
            return
        touches = [(queue, group, node) for (queue, group), node in sorted(entries.items())]
        effects.extend(ProposeTouch(chunk, now_ms) for chunk in chunks(touches))

    def route_entered(self, now_ms: int, effects: list) -> None:
        """Groups this node put messages in itself (an admin move, a dead letter) came by no route, and
        until one names this node a send elsewhere could place the group on another node and split it.
        So their routes are made here at once: a touch makes a missing route on the node it names,
        never elsewhere (else the periodic refresh would, up to a quarter of group_timeout_ms later, or
        never with it 0). A group whose route already names another node keeps it; its messages here
        wait for a consumer here, logged, as the route table decides where the group lives."""
        context = self.context
        broker = context.broker
        entered = broker.local.take_entered()
        touches = []
        for key in sorted(entered):
            owner = self.router.routes.get(key)
            if owner is None or owner == context.node_id:
                touches.append((key[0], key[1], context.node_id))
            else:
                log.warning("group %r of queue %r was given messages here (a move or a dead letter) but lives "
                            "on %s: they wait here for a consumer of this node", key[1], key[0], owner)
        effects.extend(ProposeTouch(chunk, now_ms) for chunk in chunks(touches))
