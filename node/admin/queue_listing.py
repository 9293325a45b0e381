"""`grouper queue list`: the cluster's queues, summed over its members, each member's share named.

Rules:
- In a cluster the listing is cluster-wide: one ClusterStatus call, in which the node asked gathers
  every member's queue stats with the caller's credentials. Each queue's counts are the sum over the
  members that answered, and its row says how its depth splits over them.
- A member that did not answer (down, unreachable, refused the caller) is named with its reason,
  never silently left out; the command then exits 1 (node.admin.commands' rule for a command done in
  part), its listing printed all the same.
- Where the listing cannot be cluster-wide, it says whose it is: a single node is named by its
  admin address; a caller without `manage` on '#' (ClusterStatus needs it) gets the queues of the node
  asked, named, and told why not the others.
- Nodes are named as the console and `grouper cluster status` name them: by their raft address.
- `gather` makes the admin calls; the rest is pure: plain dicts in (AdminClient's shapes), rows and
  text out.
"""

from __future__ import annotations

from dataclasses import dataclass

from node.admin.client import AccessDenied

SUMMED_FIELDS = ("depth_messages", "depth_bytes", "acquired_messages", "consumers", "browsers", "groups",
                 "owned_groups", "enqueued_total", "delivered_total", "resident_bytes", "paged_bytes",
                 "cold_messages")
SUMMED_FIELDS += ("runnable_groups", "blocked_groups", "held_groups")  # issue 30, group signals


def cluster_queues(status: dict) -> tuple[list[dict], list[tuple[str, str]]]:
    """(one stats dict per queue, summed over the members that answered, with "nodes": {node: that
    member's stats}; [(node, why it is missing)] for the members that did not answer)."""
    by_name: dict[str, dict] = {}
    missing: list[tuple[str, str]] = []
    for member in sorted(status["members"], key=lambda member: member["node"]):
        if member["error"]:
            missing.append((member["node"], member["error"]))
            continue
        for stats in member["queues"]:
            total = by_name.setdefault(stats["name"], {"name": stats["name"], **dict.fromkeys(SUMMED_FIELDS, 0),
                                                       "nodes": {}})
            for field in SUMMED_FIELDS:
                total[field] += stats.get(field, 0)
            oldest = [at for at in (total.get("oldest_head_enqueued_at_ms", 0),
                                    stats.get("oldest_head_enqueued_at_ms", 0)) if at]
            total["oldest_head_enqueued_at_ms"] = min(oldest, default=0)  # issue 30: the oldest of any node
            total["nodes"][member["node"]] = stats
    return [by_name[name] for name in sorted(by_name)], missing


def depth_by_node(queue: dict) -> str:
    return ", ".join(f"{node}={stats['depth_messages']}" for node, stats in queue["nodes"].items())


def answered_line(status: dict, missing: list[tuple[str, str]]) -> str:
    answered = [member["node"] for member in sorted(status["members"], key=lambda member: member["node"])
                if not member["error"]]
    line = (f"cluster-wide: {len(answered)} of {len(status['members'])} nodes answered "
            f"({', '.join(answered) or 'none'}; asked {status['node']})")
    return line + "".join(f"; {node} did not: {why}" for node, why in missing)


@dataclass(frozen=True)
class Listing:
    queues: list[dict]  # stats dicts; in a cluster summed, with "nodes": {node: that member's stats}
    whose: str  # whose queues these are, said under the table
    missing: list[tuple[str, str]]  # (node, why) of members that did not answer
    clustered: bool


def gather(client, local: bool) -> Listing:
    """The listing the node at `client` can give this caller: cluster-wide unless `local`."""
    status, whose = None, f"the queues of the node at {client.address} only (--local)"
    if not local:
        try:
            status = client.cluster_status()
        except AccessDenied as error:
            if error.status != "PERMISSION_DENIED":
                raise
            # ListQueues is open to every user; ClusterStatus needs manage on '#'
            whose = f"the queues of the node at {client.address} only: listing its peers' too takes `manage` on '#'"
    if status is None or not status["clustered"]:
        whose = whose if status is None else f"a single node, at {client.address}"
        return Listing(client.list_queues(), whose, [], clustered=False)
    queues, missing = cluster_queues(status)
    return Listing(queues, answered_line(status, missing), missing, clustered=True)
