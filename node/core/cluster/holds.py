"""Holds: groups this node keeps in its broker for the cluster, delivering none of them (the queue's own
hold, node/core/dispatch/queue.py `hold_group`).

Rules:
- A group is held while this node may not deliver it: moving away from here, recovered here before the
  replica is current (it may live elsewhere now, or be arriving here by a move), or read back from a
  cold tail while it lives elsewhere. handover.py decides when a hold ends; this module only keeps them.
- `restored` marks the holds of what the journal or a cold tail gave back: once the replica is current
  they are handed to the group's owner when that is another node (handover.py `review_holds`).
- Imports only context.py of this package.
"""

from __future__ import annotations

from node.core.cluster.context import Context
from node.core.errors import GrouperError


class Holds:
    def __init__(self, context: Context):
        self.context = context
        self.held: set[tuple[str, str]] = set()  # keys this node holds in its broker for the cluster
        self.restored: set[tuple[str, str]] = set()  # held since recovery until the replica is current

    def hold(self, key: tuple[str, str]) -> None:
        try:
            queue = self.context.broker.queue(key[0], create=True)
        except GrouperError:
            return  # no such queue and none may be made: nothing of the group can be enqueued here
        self.held.add(key)
        queue.hold_group(queue.group_key_of_route(key[1]))

    def unhold(self, key: tuple[str, str], now_ms: int, effects: list) -> None:
        self.held.discard(key)
        self.restored.discard(key)
        queue = self.context.broker.queues.get(key[0])
        if queue is not None:
            broker_effects: list = []
            queue.release_group(queue.group_key_of_route(key[1]), now_ms, broker_effects)
            if broker_effects:
                self.context.broker_effects(broker_effects, effects)

    def hold_recovered(self) -> None:
        """After recovery, before any consumer: hold every group recovered here until the replica is
        current; this node may no longer own it (a ghost whose REMOVE a failed write lost, its idle route
        expired and claimed elsewhere since; a group failed over), or be the new owner of a move still in
        progress. So with or without groups following their consumers."""
        broker = self.context.broker
        broker.local.take_queues()  # what recovery declared is the journal's, made by no client now
        for name, queue in broker.queues.items():
            if queue.settings.grouping:
                for route_key in queue.busy_route_keys():
                    self.hold((name, route_key))
                    self.restored.add((name, route_key))

    def hold_strays(self, name: str, records: dict) -> None:
        """Cold records about to join queue `name`'s warm part: a group of theirs that lives elsewhere now
        (or may: the replica is not current) is held first, as recovery holds the groups it sees
        (hold_recovered), and handed to its owner as they are."""
        context = self.context
        queue = context.broker.queues.get(name)
        if queue is None or not queue.settings.grouping:
            return
        routes, ready = context.router.routes, context.router.ready
        for message in records.values():
            if message is None:
                continue
            key = (name, queue.route_key(message.group_id))
            if key in self.held or key[1] is None:
                continue
            owner = routes.get(key)
            if not ready or (key not in context.moves and owner is not None and owner != context.node_id):
                self.hold(key)
                self.restored.add(key)
