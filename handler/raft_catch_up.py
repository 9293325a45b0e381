"""How the raft leader walks a diverged follower's log back: a refusal never sends it forward again.

pysyncobj 0.3.17's leader sends a follower its log from `nextIndex` to the end at each tick, one batch
(appendEntriesBatchSizeBytes, 64 KiB) per message, and moves `nextIndex` to the end as it sends. A
follower whose log diverges (a leader cut off with proposals it appended and never committed) refuses
every one of those messages with a reset: the first at its prevLogIdx (walk back one), each later one
at the follower's last index + 1 (it has no entry at their prevLogIdx). The leader kept the last reset
it read, so `nextIndex` came back above the divergence at every tick while the log ahead held more than
one batch, and the follower never caught up: its node refused new groups for minutes (finding 9,
docs/reliability.md; where groups follow their consumers, moves make entries of tens of KiB).

Rules:
- Between two acceptances from a follower, in one term, a refusal only ever lowers the leader's
  `nextIndex` for it: `CatchUp.refused` keeps the lowest index refused (the floor) and answers it.
- An acceptance clears the follower's floor; a new term or a lost leadership clears them all.
- A floor that has not gone lower for FLOOR_AGE_MAX_S is dropped (pysyncobj's own answer stands
  again), so a case this rule did not foresee costs at most that long, never a follower for good.
- `CatchUp` is pure (it takes `now_s`); `CatchUpSyncObj` only carries it out around pysyncobj's
  private message handler, on pysyncobj's tick thread.
"""

from __future__ import annotations

from pysyncobj import SyncObj
from pysyncobj.monotonic import monotonic as raft_clock

FLOOR_AGE_MAX_S = 5.0  # a walk back that went no lower for this long is left to pysyncobj again
_LEADER = 2  # pysyncobj's _RAFT_STATE.LEADER


class CatchUp:
    """The leader's floors: follower -> (lowest nextIndex a refusal named this term, when it was set)."""

    def __init__(self):
        self.term = -1
        self.floors: dict = {}

    def refused(self, follower, term: int, next_index: int, now_s: float) -> int:
        """A reset refusal naming `next_index`: the nextIndex to keep for `follower`."""
        if term != self.term:
            self.term, self.floors = term, {}
        floor = self.floors.get(follower)
        if floor is not None and floor[0] <= next_index and now_s - floor[1] <= FLOOR_AGE_MAX_S:
            return floor[0]  # a later message's refusal: the walk back goes on from the floor
        self.floors[follower] = (next_index, now_s)
        return next_index

    def accepted(self, follower) -> None:
        self.floors.pop(follower, None)

    def clear(self) -> None:
        self.floors = {}


class CatchUpSyncObj(SyncObj):
    """pysyncobj's SyncObj with the rule above applied to the leader's 'next_node_idx' answers."""

    def __init__(self, *args, **kwargs):
        self._catch_up = CatchUp()  # before SyncObj starts its tick thread, which may call the handler
        super().__init__(*args, **kwargs)

    def _SyncObj__onMessageReceived(self, node, message):  # pysyncobj's private handler, name-mangled
        SyncObj._SyncObj__onMessageReceived(self, node, message)
        if not isinstance(message, dict) or message.get("type") != "next_node_idx":
            return
        if self._SyncObj__raftState != _LEADER:
            self._catch_up.clear()
            return
        if message.get("success"):
            self._catch_up.accepted(node)
        elif message.get("reset"):
            self._SyncObj__raftNextIndex[node] = self._catch_up.refused(
                node, self._SyncObj__raftCurrentTerm, message["next_node_idx"], raft_clock())
