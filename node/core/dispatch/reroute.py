"""Rerouting a queue's messages to another address on this node: Qpid's queue reroute, for groups.

Pure, owned by the engine loop thread like the broker it works on. A `Reroute` is one operator's
request (all of a queue, its first N messages, or one group's); the caller runs `batch` once per
engine loop turn until `done` and carries out each batch's effects. Rules:
- The destination is a queue or a multicast address (node/core/dispatch/addresses.py), never auto-created:
  a multicast address gives one copy to each of its subscription queues, as a send there would.
  Each copy's group is what that queue reads from the payload (`regroup`: the adapter's codec, when
  its group_header differs from the source's), so the destination groups it as it groups sends.
  A destination group gathering several source groups gets each one's messages in order, moved
  one source group after another (the first N: in queue order).
- Only available messages go; a group with deliveries unsettled here is left whole (its rest would
  otherwise reach the destination's consumers while its head may still come back here), and so is
  a group the cluster holds (it is moving between nodes). Both are named in `stayed_reason`.
- Each group's messages go in queue order, as a prefix: the first refusal (the destination is full,
  a group would be past its groups_max, the group's owner cannot be told now) stops the whole
  reroute, so no later message of any group overtakes one that stayed. What moved and what stayed
  are counted; `stayed_reason` says why, and who can fix it.
- A copy is journalled (`Stored` at the destination, or a STORE in the outbound channel of the
  node owning its group: `forwards`, which the cluster protocol journals) before its source's
  `Removed`, in the same engine loop turn and so the same journal batch: a crash keeps the message
  at the source, or at both after a torn tail (a duplicate, as a move), never nowhere.
- In a cluster `owner_of(queue, route_key, size_bytes)` says where a destination group lives: None
  here (a group with no route yet gets one naming this node: the broker's `entered`), a node id to
  forward to, or it raises a GrouperError (the group is moving; the replica is catching up; the
  owner's outbound channel is at its bound), which stops the reroute as a full destination does.
- Copies carry their bodies: a message whose body is paged out to the journal (node/core/dispatch/paging.py)
  is not moved before it is read back. The batch stops there, asks for it, and says so
  (`waiting_for_bodies`); the caller runs the next batch once it may be back, and gives up after its
  deadline (`give_up`), the rest counted as stayed.
- A queue with a cold tail (node/core/dispatch/cold.py) is refused at the start, naming the budget: which
  groups its cold messages belong to is not known until they are read back.
- The selection is fixed at the start: the groups the queue has then, moved group by group; or the
  first N, found by one scan in queue order and moved in that order. A message arriving meanwhile
  stays. At most MESSAGES_PER_BATCH_MAX messages move per batch, so a large backlog never holds the
  loop long (the first N's scan is one turn of its own cost, and each turn of messages in no group
  scans the queue: ~7 ms per 100,000 messages).
"""

from __future__ import annotations

from typing import Callable, NamedTuple

from node.core.effects import Stored
from node.core.errors import GrouperError, InvalidField, NotFound
from node.core.dispatch.message import AVAILABLE, PAGED, Message

MESSAGES_PER_BATCH_MAX = 2_000  # messages rerouted per engine loop turn: ~10-20 ms of CPU (measured)
_UNGROUPED = object()  # plan key of the messages in no group


class Forward(NamedTuple):
    """A copy whose destination group lives on another node: for its outbound channel."""

    owner: str
    queue: str
    route_key: str
    message: Message
    durable: bool


class Reroute:
    def __init__(self, source: str, destination: str, *, group: str | None = None, count_max: int | None = None):
        if count_max is not None and count_max < 1:
            raise InvalidField(f"count: must be >= 1, got {count_max} (leave it out for every message)")
        self.source = source
        self.destination = destination
        self.group = group
        self.count_max = count_max
        self.moved = 0  # messages taken from the source (a multicast destination got a copy each)
        self.stayed = 0  # messages selected that are still at the source
        self._reasons: list[str] = []  # why messages stayed (stayed_reason)
        self.done = False
        # the last batch stopped at a body paged out to the journal, whose read-back it asked for: the
        # caller runs the next one once the body may be back (see the header)
        self.waiting_for_bodies = False
        self._plan: list[list] | None = None  # [group key or _UNGROUPED, messages still to move or None = all]
        self._position = 0

    # ---- one batch -----------------------------------------------------------------------------

    def batch(self, broker, now_ms: int, *, owner_of: Callable | None = None, regroup: Callable | None = None,
              messages_max: int = MESSAGES_PER_BATCH_MAX) -> tuple[list, list[Forward]]:
        """Move up to `messages_max` messages; returns the broker effects and the forwards, which the
        caller journals before the effects (a STORE before its source's REMOVE)."""
        source = broker.queue(self.source)
        targets = self._targets(broker, source)
        if self._plan is None:
            source.cold_refusal("rerouting")  # the selection must know every message's group
            self._plan = self._make_plan(source)
        effects: list = []
        forwards: list[Forward] = []
        room = messages_max
        self.waiting_for_bodies = False
        while room and self._position < len(self._plan) and not self.done:
            key, wanted = self._plan[self._position]
            busy = self._busy(source, key)
            if busy:  # left whole: see the header
                self.stayed += self._left(source, key, wanted)
                self._reasons.append(busy)
                self._position += 1
                continue
            moving, paged = self._head(source, key, wanted, room)
            moved = self._move(broker, source, targets, key, moving, now_ms, effects, forwards, owner_of, regroup)
            room -= moved
            if wanted is not None:
                self._plan[self._position][1] = wanted = wanted - moved
            if self.done:
                self.stayed += self._left(source, key, wanted)
                self._count_rest(source)
            elif paged:  # the group's next body is on its way back from the journal: no later one may go first
                self.waiting_for_bodies = True
                break
            elif len(moving) < room + moved or wanted == 0:  # this group is through
                self._position += 1
        if self._position >= len(self._plan):
            self.done = True
        for target in targets:
            target.tick(now_ms, effects)
        source.tick(now_ms, effects)  # dispatch goes on with what is left
        return effects, forwards

    @property
    def stayed_reason(self) -> str:
        """Why messages stayed ("" when none did): each reason once, in the order met."""
        return "; ".join(dict.fromkeys(self._reasons)) if self.stayed else ""

    def _targets(self, broker, source) -> list:
        name = self.destination
        if broker.addresses.is_multicast(name):
            targets = [broker.queues[queue] for queue in broker.addresses.subscriptions(name)]
            if not targets:
                raise NotFound(f"multicast address {name!r} has no subscription queue on this node: a message "
                               f"rerouted there would reach nobody; subscribe a queue first")
        elif name in broker.queues:
            targets = [broker.queues[name]]
        else:
            raise NotFound(f"no queue or multicast address {name!r} on this node to reroute to (a reroute makes "
                           f"none); declare it with 'grouper queue add', or check the name")
        if source in targets:
            raise InvalidField(f"cannot reroute queue {self.source!r} to {name!r}: it is "
                               f"{'that address' if len(targets) == 1 else 'one of its subscriptions'}, so its "
                               f"messages would come back to it")
        return targets

    def _make_plan(self, source) -> list[list]:
        if self.group is not None:
            key = source.group_key_from_text(self.group)
            if key not in source.groups:
                raise NotFound(f"queue {self.source!r} has no group {self.group!r} on this node")
            return [[key, self.count_max]]
        if self.count_max is None:
            return [[key, None] for key in list(source.groups)] + [[_UNGROUPED, None]]
        # the first count_max available messages in queue order, as runs of one group each: moved run
        # by run, they reach the destination in the order they had here
        runs: list[list] = []
        taken = 0
        for message in source.browse_available():
            if taken >= self.count_max:
                break
            if message.state != AVAILABLE:
                continue
            key = message.group.key if message.group is not None else _UNGROUPED
            if runs and runs[-1][0] == key:
                runs[-1][1] += 1
            else:
                runs.append([key, 1])
            taken += 1
        return runs

    def _head(self, source, key, wanted: int | None, room: int) -> tuple[list[Message], bool]:
        """(the next messages of plan entry `key` to move, whether they end before one whose body is
        paged out: its read-back is asked for)."""
        count = room if wanted is None else min(wanted, room)
        if key is _UNGROUPED:
            head = []
            for message in source.browse_available():
                if len(head) >= count:
                    break
                if message.state == AVAILABLE and message.group is None:
                    if message.flags & PAGED:
                        source.pager.want_whole(None)
                        return head, True
                    head.append(message)
            return head, False
        if key not in source.groups:
            return [], False  # drained or purged since the plan was made: nothing of it is left to move
        head = source.group_head_messages(key, count)  # ends before a paged body, and asks for it
        return head, len(head) < count and source.group_available(key) > len(head)

    def _left(self, source, key, wanted: int | None) -> int:
        """Messages of plan entry `key` still selected and at the source."""
        if key is _UNGROUPED:
            available = sum(1 for message in source.browse_available()
                            if message.state == AVAILABLE and message.group is None)
        else:
            available = source.group_available(key)
        return available if wanted is None else min(available, wanted)

    def give_up(self, broker, reason: str) -> None:
        """Stop where it is (bodies the journal did not give back in time): the rest stays, counted."""
        if self.done:
            return
        self._reasons.append(reason)
        self.done = True
        if self._plan is not None and self._position < len(self._plan):
            source = broker.queue(self.source)
            key, wanted = self._plan[self._position]
            self.stayed += self._left(source, key, wanted)
            self._count_rest(source)

    def _count_rest(self, source) -> None:
        for key, wanted in self._plan[self._position + 1:]:
            self.stayed += self._left(source, key, wanted)
        self._position = len(self._plan)

    # ---- moving ----------------------------------------------------------------------------------

    def _stop(self, reason: str) -> None:
        self.done = True
        self._reasons.append(reason)

    def _busy(self, source, key) -> str:
        """Why group `key` must stay whole now, or ""."""
        group = source.groups.get(key) if key is not _UNGROUPED else None
        if group is None:
            return ""
        name = self.group if self.group is not None else str(key)
        if group.acquired:
            return (f"group {name} of queue {self.source!r} stays whole while {group.acquired} of its messages "
                    f"are delivered and not settled; reroute it once they are")
        if key in source.held_keys:
            return (f"group {name} of queue {self.source!r} stays whole while it moves between nodes; "
                    f"retry once the move ended")
        return ""

    def _move(self, broker, source, targets, key, moving: list[Message], now_ms: int, effects: list,
              forwards: list[Forward], owner_of, regroup) -> int:
        """Copy `moving` (a group's head, in order) to every target and take it from the source, up to
        the first refusal; returns how many moved."""
        if not moving:
            return 0
        stored: list = []
        removed: list = []
        count = 0
        for old in moving:
            try:
                placed = [self._place(target, source, old, owner_of, regroup) for target in targets]
            except GrouperError as error:
                self._stop(f"{error.description} ({self.moved + count} moved before it)")
                break
            old.handed_out = True  # its copies live on at the destination: a failed write cannot take it back
            for target, (group_id, owner, route_key) in zip(targets, placed):
                copy = Message(old.payload, group_id, expires_at_ms=old.expires_at_ms,
                               closes_group=old.closes_group, delivery_count=old.delivery_count,
                               enqueued_at_ms=old.enqueued_at_ms)
                if owner is not None:
                    forwards.append(Forward(owner, target.settings.name, route_key, copy, target.settings.durable))
                    continue
                copy.seq = broker.next_seq
                broker.next_seq += 1
                target.restore(copy)
                target.enqueued_total += 1
                if route_key is not None and broker.local is not None:
                    broker.local.entered.add((target.settings.name, route_key))
                if target.settings.durable:
                    stored.append(Stored(target.settings.name, copy))
            count += 1
        if count:
            if key is _UNGROUPED:
                taken = source.take_ungrouped_messages(count, removed)
            else:
                taken = source.take_group_messages(key, count, removed)
            assert taken == moving[:count], (taken, moving[:count])  # the head does not change within a turn
        effects.extend(stored)
        effects.extend(removed)  # after the copies' STOREs: a torn journal tail duplicates, never loses
        self.moved += count
        return count

    def _place(self, target, source, old: Message, owner_of, regroup) -> tuple:
        """(group id, owning node or None for here, route key) of `old`'s copy in `target`; raises
        what the target would refuse it with."""
        group_id = old.group_id
        if regroup is not None and target.settings.group_header != source.settings.group_header:
            group_id = regroup(old.payload, target.settings.group_header)
        route_key = target.route_key(group_id)
        owner = (owner_of(target.settings.name, route_key, old.size_bytes)
                 if owner_of is not None and route_key is not None else None)
        if owner is None:
            target.check_enqueue(group_id, old.size_bytes)
        return group_id, owner, route_key


