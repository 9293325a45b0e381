"""Leader watch: what this raft member notices of its leader, and the early election when the leader goes.

Owns, on pysyncobj's tick thread only, what the member remembers of leaders (one was known once; the
last one it followed) and what it does with it: it says why an election started, and when the
connection of the leader it follows closes (its process died: the kernel closes its sockets) it elects
after a random wait in LEADER_LOST_ELECTION_MS instead of its whole election timeout. The randomness
keeps two followers from splitting the vote; the floor lets a mere reconnect win. It reads and moves
pysyncobj's private election deadline (pysyncobj offers no call for it), only ever earlier.
"""

from __future__ import annotations

import logging
import random
import time

from pysyncobj.monotonic import monotonic as raft_clock

log = logging.getLogger("grouper.handler")

LEADER_LOST_ELECTION_MS = (40, 140)  # the wait before electing once the followed leader's connection closed
_CANDIDATE, _FOLLOWER, _LEADER = 1, 0, 2  # pysyncobj's raft states


class LeaderWatch:
    def __init__(self, election_timeout_ms: tuple[int, int], on_ready):
        self.syncobj = None  # set once pysyncobj is built: its callbacks are built before it
        self._election_timeout_ms = election_timeout_ms
        self._on_ready = on_ready
        self._had_leader = False  # a leader was known once (an election after that is news)
        self._followed_leader: str | None = None  # the last leader this member knew of

    def ready(self) -> None:
        self._had_leader = True
        log.info("grouping handler ready: replica caught up with the raft log")
        self._on_ready()

    def state_changed(self, old_state, new_state) -> None:
        if new_state == _CANDIDATE and old_state == _FOLLOWER:  # a follower's election timeout fired: say what it saw
            transport = self.syncobj._SyncObj__transport  # pysyncobj keeps it private; ours is a RaftTransport
            # a member that never had a leader (a cluster forming) elects as a matter of course
            log.log(logging.WARNING if self._had_leader else logging.INFO,
                    "raft election started by this member: its leader's connection closed, or no message "
                    "came from a leader within the election timeout (%d-%d ms); %s",
                    self._election_timeout_ms[0], self._election_timeout_ms[1],
                    transport.pulse(time.monotonic()))
        if new_state == _LEADER:
            self._had_leader = True
            log.info("this node is now the raft leader: the LOCAL grouping handler")

    def note_leader(self) -> None:  # after every tick
        leader = self.syncobj._getLeader()
        if leader is not None:
            self._followed_leader = str(leader.id)

    def member_lost(self, node) -> None:
        syncobj = self.syncobj
        leader = syncobj._getLeader()
        if not lost_leader(syncobj._isLeader(), str(leader.id) if leader is not None else None,
                           self._followed_leader, str(node.id)):
            return
        wait_ms = random.uniform(*LEADER_LOST_ELECTION_MS)
        # pysyncobj keeps the deadline private, on its own clock (not time.monotonic: they differ by a
        # constant here); earlier only, so a vote already due is not put off
        deadline_s = raft_clock() + wait_ms / 1000
        if deadline_s < syncobj._SyncObj__raftElectionDeadline:
            syncobj._SyncObj__raftElectionDeadline = deadline_s
            log.info("raft leader %s closed its connection: electing a new one in %.0f ms unless it is back",
                     node.id, wait_ms)


def lost_leader(is_leader: bool, leader: str | None, followed: str | None, lost: str) -> bool:
    """Is the member whose connection closed the leader this follower follows, so that it should
    elect now? `leader`: the leader pysyncobj knows now; `followed`: the last one it knew. A vote
    request from the other follower, which saw the close first, makes pysyncobj forget its leader
    before this close is heard; if that follower's log was behind, its vote fails, and unless this
    member elects at once too, the next election waits out a whole election timeout (the benchmark
    saw 620 ms from the kill to the next decision)."""
    if is_leader:
        return False
    return (leader if leader is not None else followed) == lost
