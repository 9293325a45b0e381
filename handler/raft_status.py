"""The raft member's status: what pysyncobj says of this member and its partners, as plain data.

Owns reading pysyncobj's status (and the route table) from threads other than the tick thread that
changes them: a read that meets a dict changing size is tried again, up to STATUS_TRIES times, and then
says so (TimeoutError: try again later). Never changes any state.
"""

from __future__ import annotations

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
