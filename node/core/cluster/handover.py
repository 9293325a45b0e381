"""Handovers: groups follow their consumers (docs/cluster-protocol.md tells the whole story). The leader
moves a group's route from O (the old owner) to N (the new one); this module holds, hands over, relays
and parks so that the move never reorders a (producer, group) nor lets two consumers hold the group.

Rules:
- A producer's send (protocol.py) and a forwarded entry (owner.py) ask `placement(key, source, owner)`
  where a message of a group goes: QUEUE (this node's queue, held if it must be), PARK (behind a
  handover), RELAY (on to the new owner), REFUSE (a producer here, its group moving away behind a cold
  tail), AS_ROUTED (no move concerns it). They never read the holds, parks or sweeps themselves.
- O holds the group (delivers none of it) and, once nothing of it is in flight, hands its available
  messages to N through its outbound channel, in queue order, within HANDOVER_MESSAGES_PER_TICK and
  HANDOVER_BYTES_PER_TICK a tick; the outbound STOREs go before the queue's REMOVEs in one journal batch
  (a torn tail may duplicate one, never lose one); a failed write stops the node (MustAgree).
- A message of the group reaching O meanwhile goes behind the rest: into O's queue while the group has
  anything there (parked where the queue would put it cold, sweep.py), else relayed to N.
- N queues what O sends and parks everything else of the group until the move ends (parking.py).
- Every node proposes its clear once its channel to O holds none of the group; O clears last, once
  nothing of the group is left here and N acknowledged all it was handed (`paid`); clears are proposed
  again every MOVE_CLEAR_RETRY_INTERVAL_MS while this node is waited for.
- Moves are driven only while the replica is current; a restarted node holds every group it recovered
  until then (hold_recovered), and hands what lives elsewhere now to its owner.
- Imports context, forwarding, holds, parking and sweep of this package.
"""

from __future__ import annotations

from node.core.cluster.context import Context, MustAgree, chunks, moved_copy
from node.core.cluster.forwarding import Forwarding
from node.core.cluster.holds import Holds
from node.core.cluster.parking import Parking
from node.core.cluster.sweep import Sweeps
from node.core.effects import AfterFlush, ProposeMoveClear
from node.core.errors import HandlerUnavailable
from node.core.dispatch.message import Message

MOVE_CLEAR_RETRY_INTERVAL_MS = 1000  # a clear the log still waits for is proposed again this often
# what an old owner hands over in one tick, over all its groups moving away; a group goes in as many
# ticks as it takes, in order. The engine loop serves its clients between ticks, and the journal and
# forwarders drain what went (bench/follow_moves.py: 1,000,000 messages of 100 groups in one tick held the
# loop ~50 s and tripled the node's memory); the bytes bound large messages (the one reaching it goes)
HANDOVER_MESSAGES_PER_TICK = 5000
HANDOVER_BYTES_PER_TICK = 16 << 20

# where a message of a group goes (`placement`)
QUEUE = "queue"
PARK = "park"
RELAY = "relay"
REFUSE = "refuse"
AS_ROUTED = "as routed"


class Handovers:
    def __init__(self, context: Context, forwarding: Forwarding, parking: Parking, holds: Holds):
        self.context = context
        self.forwarding = forwarding
        self.parking = parking
        self.holds = holds
        self.moves = context.moves
        self.parked = parking.parked
        self.held = holds.held
        self.hold = holds.hold
        # [messages, bytes] the old owner may still hand over this tick (`drive` sets it each tick)
        self.left = [HANDOVER_MESSAGES_PER_TICK, HANDOVER_BYTES_PER_TICK]
        # key -> the highest forward seq of what this old owner handed over or relayed: the new owner must
        # hold all that before the move may end (what its producers send after is the group's next, and
        # may still be on its way: the channel keeps its order)
        self.owed: dict[tuple[str, str], int] = {}
        self.clear_due_ms: dict[tuple[str, str], int] = {}  # key -> when its clear may be proposed again
        self.sweeps = Sweeps(context, forwarding, self.owed)
        self.taking_over, self.promoted_away = set(), False  # keys a takeover holds; fenced? (takeovers.py)

    # ---- the one-way interface -------------------------------------------------------------------

    def placement(self, key: tuple[str, str], source: str | None, owner: str | None = None) -> str:
        """Where a message of group `key` goes: from `source` (None: a producer here, its group routed
        to `owner`)."""
        me = self.context.node_id
        if key in self.taking_over:
            return PARK  # behind what a takeover puts in the queue (takeovers.py)
        move = self.moves.get(key)
        if source is None:
            if move is None:
                return PARK if owner == me and key in self.parked else AS_ROUTED
            if move[1] == me:
                return PARK  # behind the move's handover
            if move[0] == me and self.busy(key):
                # behind a cold tail the group may have messages in: a producer here is refused until the
                # group has left (parked, its steady sends would keep the move from ever ending: the park
                # is relayed only once on disk, and the group is busy while anything is)
                return REFUSE if self.parks_here(key) else QUEUE
            return AS_ROUTED
        if move is not None:
            from_node, to_node, _ = move
            if from_node == me:
                if not self.busy(key):
                    return RELAY
                return PARK if self.parks_here(key) else QUEUE
            if to_node == me:
                return QUEUE if source == from_node else PARK
            owner = to_node  # a move between two other nodes: the group's owner once it ends
        else:
            owner = self.context.router.routes.get(key)
        if owner is not None and owner != me and self.promoted_away and move is None and source != owner:
            return RELAY  # a group this node lost to a promotion: its owner has the rest (takeovers.py)
        if owner is not None and owner != me:
            # another node's group sent here: a move this replica has not seen yet (its sender's replica is
            # ahead). The old owner's handover goes first; anything else waits behind it
            return QUEUE if source == owner else PARK
        return PARK if key in self.parked else QUEUE

    def refusal(self, key: tuple[str, str]) -> HandlerUnavailable:
        """Why a producer's message of group `key` is refused here (REFUSE)."""
        self.context.counts["moving_refused"] += 1
        return HandlerUnavailable(
            f"group {key[1]!r} of queue {key[0]!r} is moving from node {self.context.node_id} to "
            f"{self.moves[key][1]}, where its consumers went, and its backlog here is partly past the "
            f"node's record budget (record_memory_max_bytes): the message was not enqueued; "
            f"send it again shortly")

    def relay(self, key: tuple[str, str], message: Message, durable: bool, now_ms: int, effects: list,
              origin: tuple) -> None:
        """A forwarded message of a group moving away from here, with nothing left here: on to its new owner."""
        to_node = self.moves[key][1] if key in self.moves else self.context.router.routes[key]  # promoted away
        self.forwarding.forward(to_node, key[0], key[1], message, durable, now_ms, effects, origin)
        self.owed[key] = message.seq
        self.context.counts["messages_relayed"] += 1

    def queue_arrival(self, key: tuple[str, str]) -> None:
        """A message of group `key` is about to be enqueued here (QUEUE): held first if it must be."""
        if key not in self.held and self.holding(key, arriving=True):
            self.hold(key)

    # ---- the moves the log brings --------------------------------------------------------------------

    def moves_changed(self, moves, snapshot: bool = False) -> None:
        """MOVES (waiting empty: the move ended), or MOVES_ALL (`snapshot`: what it does not hold ended)."""
        if snapshot:
            fresh = {(entry[0], entry[1]) for entry in moves}
            moves = [(queue, group, "", "", ()) for queue, group in sorted(self.moves)
                     if (queue, group) not in fresh] + list(moves)
        for queue, group, from_node, to_node, waiting in moves:
            key = (queue, group)
            if waiting:
                self.moves[key] = (from_node, to_node, frozenset(waiting))
                if from_node == self.context.node_id and key not in self.held:
                    self.hold(key)
            elif self.moves.pop(key, None) is not None:
                self.clear_due_ms.pop(key, None)
                self.owed.pop(key, None)
                self.sweeps.swept.discard(key)
                self.context.counts["moves_ended"] += 1

    def routes_removed(self, routes) -> None:
        """ROUTES: a removed route ends its move."""
        self.moves_changed([(queue, group, "", "", ()) for queue, group, owner in routes
                            if owner is None and (queue, group) in self.moves])

    # ---- what is here of a group ---------------------------------------------------------------------

    def busy(self, key: tuple[str, str]) -> bool:
        """This node has messages of the group: queued, in flight or parked; or, moving away from here,
        perhaps in its queue's cold tail, which no sweep has been through for it yet."""
        return key in self.parked or self.left_here(key)

    def left_here(self, key: tuple[str, str]) -> bool:
        """`busy` but for what is parked: queued or in flight here, or perhaps in the cold tail."""
        if self.context.warm_here(key):
            return True
        move = self.moves.get(key)
        return move is not None and move[0] == self.context.node_id and self.sweeps.pending(key)

    def parks_here(self, key: tuple[str, str]) -> bool:
        """A message of group `key`, moving away and busy here, waits parked rather than in the queue:
        behind others parked, or where the queue would put it in its cold tail (a sweep would have to
        find it there again, and one arriving as the sweep ends could be missed)."""
        if key in self.parked:
            return True
        queue = self.context.broker.queues.get(key[0])
        return queue is not None and queue.cold is not None and queue.cold.admits()

    # ---- holds -------------------------------------------------------------------------------------

    def holding(self, key: tuple[str, str], arriving: bool = False) -> bool:
        """Whether this node must deliver nothing of the group now; `arriving`: a message of it is
        about to be enqueued here."""
        context = self.context
        if not context.router.ready or key in self.taking_over:
            return True
        move = self.moves.get(key)
        if move is not None and context.node_id in (move[0], move[1]):
            # the old owner delivers none of the group; the new owner what its queue has of it, what
            # the old owner sent: all else waits parked (see the header)
            return move[0] == context.node_id
        if key in self.parked:
            return True
        # the group's owner, once a move between two other nodes ended; what reached this node meanwhile
        # waits for a later move here (`placement`)
        owner = context.router.routes.get(key) if move is None else move[1]
        return owner is not None and owner != context.node_id and (arriving or self.busy(key))

    def review_holds(self, now_ms: int, effects: list) -> None:
        context, me = self.context, self.context.node_id
        routes = context.router.routes
        if not context.router.ready:
            return  # every hold stands until the replica is current (`holding`), and recovery may hold many
        for key in sorted(self.parked):
            # the move it waited behind ended. A group moving on from here (before that move ended, or
            # parked here behind its cold tail) takes what it parked along instead: relayed behind the
            # rest, once nothing of it is left here (parking.py `relay`); never through its queue here, which
            # would take no more than the record budget has room for a tick
            if key not in self.moves and routes.get(key) == me and key not in self.taking_over:
                self.parking.unpark(key, now_ms, effects)
        restored = self.holds.restored
        for key in sorted(self.held):
            if key in restored:
                move = self.moves.get(key)  # what the journal held stays here unless it is moving...
                owner = routes.get(key)
                if move is not None and me not in (move[0], move[1]):
                    continue  # ...between other nodes: held until that move ends, then sent to its owner
                if move is None and owner is not None and owner != me:
                    # ...or its group lives elsewhere now: a consumer's accept whose journal write failed
                    # after the group moved on, a group failed over. Its owner delivers it, not this node,
                    # once its paged bodies are back (still held till then, tried again at the next tick)
                    if not self.hand_over(key, owner, now_ms, effects):
                        continue
                    self.owed.pop(key, None)
                    context.counts["restored_handed_over"] += 1
                restored.discard(key)
            if not self.holding(key):
                self.holds.unhold(key, now_ms, effects)

    # ---- the old owner, at each tick -----------------------------------------------------------------

    def drive(self, now_ms: int, effects: list) -> None:
        context, me = self.context, self.context.node_id
        self.left = [HANDOVER_MESSAGES_PER_TICK, HANDOVER_BYTES_PER_TICK]  # restored groups' too
        self.review_holds(now_ms, effects)
        if not context.router.ready:
            return  # a replaying replica may see moves the log has ended since
        clears = []
        for key, (from_node, to_node, waiting) in sorted(self.moves.items()):
            if from_node == me:
                self.hand_over(key, to_node, now_ms, effects)  # what this tick has room for; the rest later
                # what it parked (behind a cold tail, or an earlier move's handover) goes on once nothing
                # else of the group is left here (left_here weighs its cold tail)
                if key in self.parked and not self.left_here(key):
                    self.parking.relay(key, to_node, self.left, self.owed, now_ms, effects)
            if me not in waiting or now_ms < self.clear_due_ms.get(key, 0):
                continue
            if from_node == me:
                clear = waiting == {me} and not self.busy(key) and self.paid(key, to_node)
            else:
                clear = not self.forwarding.outbound.count(from_node, key)
            if clear:
                clears.append((key[0], key[1], from_node, to_node))
                self.clear_due_ms[key] = now_ms + MOVE_CLEAR_RETRY_INTERVAL_MS
        if clears:
            effects.extend(ProposeMoveClear(chunk) for chunk in chunks(clears))
        self.sweeps.start(self.held, effects)

    def paid(self, key: tuple[str, str], to_node: str) -> bool:
        """The new owner acknowledged everything this old owner handed over or relayed to it."""
        owed = max(self.owed.get(key, 0), self.forwarding.recovered_top.get(to_node, 0))
        channel = self.forwarding.outbound.channels.get(to_node)
        return not channel or next(iter(channel)) > owed  # a channel is in forward seq order

    def hand_over(self, key: tuple[str, str], to_node: str, now_ms: int, effects: list) -> bool:
        """The old owner sends the group's backlog on, once nothing of it is in flight here: what this
        tick has room for (`left`), with bodies in memory (paged ones are asked for, and go at a later
        tick). True once nothing of it is left here."""
        queue = self.context.broker.queues.get(key[0])
        if queue is None:
            return True
        if key not in self.held:
            self.hold(key)
        group_key = queue.group_key_of_route(key[1])
        if queue.group_in_flight(group_key):
            return False
        left = self.left
        if not queue.group_available(group_key):
            # nothing to send; an exclusive owner here lets go of the group, which lives at to_node now
            # (else it would hold it idle, unrouted)
            queue.hand_over_group(group_key, [], 0, 0)
            return True
        if left[0] <= 0 or left[1] <= 0:
            return False  # this tick's room went to other groups: still held, the next tick goes on
        removed: list = []
        taken, whole = queue.hand_over_group(group_key, removed, left[0], left[1])
        for old in taken:
            message = moved_copy(old)
            self.forwarding.forward(to_node, key[0], key[1], message, queue.settings.durable, now_ms, effects)
            self.owed[key] = message.seq
            self.context.counts["messages_handed_over"] += 1
            left[0] -= 1
            left[1] -= old.size_bytes
        if taken:
            self.context.broker_effects(removed, effects)  # the REMOVEs after the outbound STOREs: a torn tail duplicates
            effects.append(AfterFlush(MustAgree(self.context, f"handing {len(taken)} messages of group {key[1]!r} "
                                                              f"of queue {key[0]!r} over to {to_node}")))
        return whole
