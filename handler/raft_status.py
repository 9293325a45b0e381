"""The raft member's status: what pysyncobj says of this member and its partners, as plain data.

Owns reading pysyncobj's status (and the route table) from threads other than the tick thread that
changes them: a read that meets a dict changing size is tried again, up to STATUS_TRIES times, and then
says so (TimeoutError: try again later). Never changes any state.
"""

from __future__ import annotations

import time

STATUS_TRIES = 5  # reads of state the tick thread is changing (the raft status, the table) before giving up
_PARTNER_PREFIX = "partner_node_status_server_"
_CONNECTED = 2  # pysyncobj's partner status for a connected partner
_STATES = ("follower", "candidate", "leader")  # pysyncobj's raft states 0, 1, 2


def read_while_applying(read, what: str):
    """read() state the tick thread may change meanwhile."""
    for _ in range(STATUS_TRIES):
        try:
            return read()
        except RuntimeError:
            continue
    raise TimeoutError(f"{what} kept changing while being read; try again")


def member_status(syncobj, node_id: str) -> dict:
    """This member's raft status: its state, leader, term, members and how far it applied the log."""
    raw = read_while_applying(syncobj.getStatus, "the raft status")
    leader = raw.get("leader")
    partners = sorted(key[len(_PARTNER_PREFIX):] for key in raw if key.startswith(_PARTNER_PREFIX))
    return {
        "node": node_id,
        "state": _STATES[raw["state"]] if raw["state"] in (0, 1, 2) else str(raw["state"]),
        "leader": str(leader.id) if leader is not None else "",
        "term": int(raw["raft_term"]),
        "has_quorum": bool(raw["has_quorum"]),
        "members": sorted([node_id, *partners]),
        "connected": sorted(p for p in partners if raw[f"{_PARTNER_PREFIX}{p}"] == _CONNECTED),
        "commit_index": int(raw["commit_idx"]),
        "last_applied": int(raw["last_applied"]),
        "ready": syncobj.isReady(),
    }


def leader_contact_age_ms(syncobj) -> int | None:
    """How long ago this member last heard from a raft leader, for the owner's lease (issue 28,
    node/core/cluster/owner_lease.py); None when it cannot say it heard from one. Conservative:
    - a leader: the age of its contact with a majority (the responses it received, newest first, one fewer than
      a majority of the members, itself counted): Raft's leader lease (section 6.4), which holds even for a
      leader that has not yet noticed it lost its majority (a paused member that was just resumed);
    - a follower: the age of the last message received from the leader it follows, once that message was
      processed (handler/raft_transport.py records it after pysyncobj took it in) and only while everything
      committed is applied, so the node hears of any promotion of its groups before this contact;
      a deposed leader's heartbeats stop after pysyncobj's leaderFallbackTimeout (handler/raft_setup.py).
    Read on the member channel's thread while the tick thread changes what it reads: a value read a moment
    stale only makes the age look larger."""
    now_s = time.monotonic()
    heard_at_s = syncobj._SyncObj__transport.heard_at_s  # RaftTransport's: member address -> monotonic s
    if syncobj._isLeader():
        others = list(syncobj._SyncObj__otherNodes)
        needed = (len(others) + 1) // 2  # responses that make a majority with this member's own
        if needed == 0:
            return 0
        heard = sorted((heard_at_s.get(node.address, 0.0) for node in others), reverse=True)
        return _age_ms(now_s, heard[needed - 1])
    leader = syncobj._getLeader()
    if leader is None or syncobj.raftLastApplied < syncobj.raftCommitIndex:
        return None
    heard_s = heard_at_s.get(leader.address)
    return None if heard_s is None else _age_ms(now_s, heard_s)


def _age_ms(now_s: float, heard_s: float) -> int | None:
    return None if not heard_s else max(0, int((now_s - heard_s) * 1000) + 1)  # rounded up
