"""Takeover: the order of steps by which a promoted backup makes a dead owner's groups its own (issue 28,
docs/replication.md, "A replica that takes over"), and what recovery does when a crash cut them short.

The steps, for one promotion (owner O replaced at `epoch`, `keys` = the (queue, route key) the promotion
routed to this node):
1. `begin()`: READ the live messages of O's replica journal for the keys' queues (the adapter reads on
   the replica writer's thread and hands them back; the keys' new sends and forwards wait meanwhile,
   as holds do for a move).
2. `read(found, route_key_of, first_seq)`: the plan. Into the local journal, in this order: the BEGUN mark
   (this node's next seq then: every local STORE of the keys at or above it is the takeover's), each key's
   messages in the owner's group order with their delivery count raised by DELIVERY_COUNT_RAISE (as after
   a restart: what O had delivered and not had settled comes first), then the STORED mark. The groups stay
   held until that unit is on disk.
3. `stored()`: once the local unit is durable the groups are served here; DROP their messages from the
   replica journal (the seqs the read found).
4. `dropped()`: done.
Crash rule (the local journal's mark decides; one name per owner, the last record wins, a torn tail cuts
everything after the first torn record, so a surviving STORED mark means every STORE before it survived):
- no mark of this epoch: the replica copy is the only one; the takeover runs again.
- BEGUN: the local copy may be partial: UNDO (discard the keys' local messages at or above first_seq),
  then run again. Nothing of the keys was delivered: they are held until STORED is durable.
- STORED: the local copy is whole and may have been delivered from: the replica copy's leftovers are
  dropped (REDROP: read, then drop whatever of the keys is left), never enqueued.
So recovery sees either the replica copy or the local one, never both, and nothing is lost.
Pure: no I/O, no clock, no threads. Messages are opaque here: anything with `seq`, `group_id` and
`delivery_count`.
"""

from __future__ import annotations

from typing import Callable, NamedTuple

TAKEOVER_MARK_PREFIX = "\x00takeover\x00"  # + owner: the local journal declaration of a takeover's state
DELIVERY_COUNT_RAISE = 1  # a taken-over message counts one delivery more, as after a restart
BEGUN = "begun"
STORED = "stored"

# states of a Takeover
READING = "reading"
STORING = "storing"
DROPPING = "dropping"
DONE = "done"


class ReadReplica(NamedTuple):
    """Read the live messages of `owner`'s replica journal for `queues` (sorted), in seq order."""
    owner: str
    epoch: int
    queues: tuple


class DropReplica(NamedTuple):
    """Remove these (queue, seq) of `owner`'s replica journal (the owner's seqs), durably."""
    owner: str
    epoch: int
    seqs: tuple


class Plan(NamedTuple):
    """What `read` decided: the marks and the messages to enqueue, in journal order."""
    begun: dict  # the BEGUN mark's values (a journal declaration)
    enqueues: list  # [(key, [message, ...] in group order)], keys sorted
    stored: dict  # the STORED mark's values


def mark_name(owner: str) -> str:
    return TAKEOVER_MARK_PREFIX + owner


def mark_values(owner: str, epoch: int, keys, state: str, first_seq: int) -> dict:
    return {"name": mark_name(owner), "owner": owner, "epoch": epoch, "state": state, "first_seq": first_seq,
            "keys": [list(key) for key in sorted(keys)]}


class Takeover:
    def __init__(self, owner: str, epoch: int, keys, redrop: bool = False, queues=None):
        """`redrop`: recovery found a STORED mark: only what is left of the keys in the replica is dropped.
        `queues`: a scan at a restart that found no mark of a promoted owner (a crash came before the first
        record of its takeover): the keys are those of these queues' replica messages that `mine` names."""
        self.scan_queues = tuple(sorted(queues)) if queues is not None else None
        self.owner = owner
        self.epoch = epoch
        self.keys = tuple(sorted({tuple(key) for key in keys}))
        self.redrop = redrop
        self.state = READING
        self.drops: tuple = ()
        self.taken = 0  # messages enqueued here

    def begin(self) -> ReadReplica:
        if self.scan_queues is not None:
            return ReadReplica(self.owner, self.epoch, self.scan_queues)
        return ReadReplica(self.owner, self.epoch, tuple(sorted({queue for queue, _ in self.keys})))

    def read(self, found: dict, route_key_of: Callable[[str, str | None], str | None], first_seq: int,
             mine: Callable[[tuple], bool] | None = None):
        """`found`: {queue: [message, ...] in the owner's seq order}; `route_key_of(queue, group_id)`: the
        message's route key; `mine(key)`: a scan's test. Returns the Plan, or, redropping, the DropReplica;
        None for a scan that found nothing of this node's (no record is written: done)."""
        if self.state != READING:
            raise AssertionError(f"takeover of {self.owner} at epoch {self.epoch} read twice ({self.state})")
        if self.scan_queues is not None:
            self.keys = tuple(sorted({key for queue, messages in found.items() for key in
                                      ((queue, route_key_of(queue, m.group_id)) for m in messages) if mine(key)}))
            if not self.keys:
                self.state = DONE
                return None
        wanted = set(self.keys)
        by_key: dict = {key: [] for key in self.keys}
        drops = []
        for queue in sorted(found):
            for message in sorted(found[queue], key=lambda message: message.seq):
                key = (queue, route_key_of(queue, message.group_id))
                if key in wanted:  # the other groups of that owner went to another backup, or stay
                    by_key[key].append(message)
                    drops.append((queue, message.seq))
        self.drops = tuple(drops)
        if self.redrop:
            self.state = DROPPING
            return DropReplica(self.owner, self.epoch, self.drops)
        self.state = STORING
        self.taken = len(drops)
        return Plan(mark_values(self.owner, self.epoch, self.keys, BEGUN, first_seq),
                    [(key, by_key[key]) for key in self.keys],
                    mark_values(self.owner, self.epoch, self.keys, STORED, first_seq))

    def stored(self) -> DropReplica:
        """The plan's unit is on disk: the groups may be served; drop the replica copy."""
        if self.state != STORING:
            raise AssertionError(f"takeover of {self.owner} at epoch {self.epoch}: stored while {self.state}")
        self.state = DROPPING
        return DropReplica(self.owner, self.epoch, self.drops)

    def dropped(self) -> None:
        self.state = DONE


def raised_count(delivery_count: int) -> int:
    return delivery_count + DELIVERY_COUNT_RAISE


class Recovered(NamedTuple):
    """What recovery does about one owner's takeover mark."""
    undo_first_seq: int | None  # discard the keys' local messages at or above this seq (BEGUN), else None
    takeover: Takeover  # to run again (BEGUN) or to redrop (STORED)


def recovered(mark: dict) -> Recovered:
    """The crash rule of the header, for a mark the local journal gave back."""
    keys = [tuple(key) for key in mark["keys"]]
    owner, epoch = mark["owner"], int(mark["epoch"])
    if mark["state"] == STORED:
        return Recovered(None, Takeover(owner, epoch, keys, redrop=True))
    if mark["state"] == BEGUN:
        return Recovered(int(mark["first_seq"]), Takeover(owner, epoch, keys))
    raise ValueError(f"takeover mark of owner {owner!r} has state {mark['state']!r}: this build writes "
                     f"{BEGUN!r} or {STORED!r}; the journal is from a newer build")


def promoted_owners(before: dict, after: dict, me: str) -> dict:
    """Owners other than `me` whose epoch grew between two REPLICAS copies: {owner: new epoch}."""
    return {owner: epoch for owner, epoch in after.items()
            if owner != me and epoch > before.get(owner, 0)}


def taken_over(payload, routes: dict, promoted: dict, me: str) -> dict:
    """The ROUTES after a promotion: {old owner: [key, ...]} of the routes that moved from a promoted owner
    to `me` (an ordinary move or placement is not a takeover: its old owner was not promoted)."""
    taken: dict = {}
    for queue, group, node in payload:
        old = routes.get((queue, group))
        if node == me and old is not None and old != me and old in promoted:
            taken.setdefault(old, []).append((queue, group))
    return taken
