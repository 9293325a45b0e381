"""What the console's overview and queue views show, from the admin API's answers (issue 32).

Rules:
- Pure: plain dicts in (AdminClient's shapes: cluster status, group pages; node.console.rates' rates),
  plain dicts out, ready for JSON. No calls, no clock.
- The cluster reads as one: a queue is one row, its counts summed over the members that answered
  (node/admin/queue_listing.py's sum, the one `grouper queue list` prints), its per-node split beside it.
- Nodes and consumers are named as people named them: a node by its host's first label when it is known
  by a DNS name (a StatefulSet pod, a compose service), else by its AMQP address (what clients dial);
  its raft address stays beside it. A group's owner by its consumer's container and link, not its id.
- Alarms say what is wrong and where to look, most severe first: a cluster without a leader or a
  quorum, a node marked down or unreachable, one not ready, a raft member more than
  RAFT_LAG_ALARM_ENTRIES behind the commit index, an owner under-replicated, refusals counted within
  the rate history.
"""

from __future__ import annotations

import ipaddress

from node.admin.queue_listing import cluster_queues

RAFT_LAG_ALARM_ENTRIES = 1000  # log entries applied behind the highest commit index seen: a lagging member
CRITICAL, WARNING = "critical", "warning"
ORDER_KEYS = {  # a ranked group row's sort key, greatest first, for merging the members' tops
    "backlog": lambda row: row["messages"],
    "head_age": lambda row: row["head_age_ms"] or 0,
}


def node_name(node: str, amqp_address: str = "") -> str:
    """`grouper-1` for grouper-1.grouper.ns.svc:5674; else the AMQP address; "" (a single node) stays ""."""
    host = node.rpartition(":")[0].strip("[]")
    if not host:
        return node
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host != "localhost":
            return host.split(".")[0]
    return amqp_address or node


def names(status: dict) -> dict:
    """{node id: name} of every member of a cluster status."""
    return {member["node"]: node_name(member["node"], member.get("amqp_address", "")) for member in status["members"]}


def queue_rows(status: dict, rates: dict) -> tuple[list[dict], list[dict]]:
    """(one row per queue, summed over the members, with in_per_s/out_per_s summed over the members that
    have a rate (None: none has one yet) and "nodes": [each member's row, named, with its rate]; the
    members that did not answer, named, with why)."""
    named = names(status)
    queues, missing = cluster_queues(status)
    rows = []
    for queue in queues:
        split = []
        in_per_s = out_per_s = None
        for node, stats in queue.pop("nodes").items():
            rate = rates.get((node, queue["name"]))
            if rate is not None:
                in_per_s, out_per_s = (in_per_s or 0) + rate[0], (out_per_s or 0) + rate[1]
            split.append({**stats, "node": node, "node_name": named.get(node, node),
                          "in_per_s": rate[0] if rate else None, "out_per_s": rate[1] if rate else None})
        rows.append({**queue, "in_per_s": _rounded(in_per_s), "out_per_s": _rounded(out_per_s), "nodes": split})
    return rows, [{"node": node, "node_name": named.get(node, node), "error": error} for node, error in missing]


def _rounded(value):
    return None if value is None else round(value, 2)


def counter_totals(status: dict) -> dict:
    """{(node, queue): (enqueued_total, delivered_total)} of the members that answered: a rate sample."""
    return {(member["node"], stats["name"]): (stats.get("enqueued_total", 0), stats.get("delivered_total", 0))
            for member in status["members"] if not member.get("error") for stats in member["queues"]}


def alarms(status: dict, own_states: dict, refusals: dict) -> list[dict]:
    """[{"level", "text"}], critical first. `own_states`: {node: (ready, reason, last_applied,
    commit_index)} as each member says of itself; `refusals`: {what: count within the rate history}."""
    found = []
    named = names(status)
    if status["clustered"]:
        if not status.get("leader"):
            found.append((CRITICAL, "no raft leader: an election is under way, or too few members answer"))
        elif not status.get("has_quorum"):
            found.append((CRITICAL, "this node's raft member has no quorum: groups new to the cluster wait"))
        commits = [state[3] for state in own_states.values() if state[3]]
        commit_index = max(commits, default=0)
        for member in status["members"]:
            node, name = member["node"], named[member["node"]]
            ready, reason, applied, _ = own_states.get(node, (True, "", 0, 0))
            if member.get("down"):
                found.append((CRITICAL, f"node {name} ({node}) is down: the leader marked it so; its groups move"))
            elif not member.get("connected"):
                found.append((CRITICAL, f"node {name} ({node}) is unreachable over raft from this node"))
            elif not ready:
                found.append((WARNING, f"node {name} ({node}) is not ready: {reason}"))
            if applied and commit_index - applied > RAFT_LAG_ALARM_ENTRIES:
                found.append((WARNING, f"node {name}'s raft member lags: {commit_index - applied} log entries "
                                       f"behind the commit index"))
            if member.get("under_replicated"):
                backups = ", ".join(named.get(backup, backup) for backup in member.get("in_sync", [])) or "none"
                found.append((WARNING, f"node {name} owns groups under-replicated: its in-sync backups are "
                                       f"{backups} (epoch {member.get('epoch', 0)})"))
    for what, count in sorted(refusals.items()):
        if count:
            found.append((WARNING, f"{count} {what} in the last minutes"))
    return [{"level": level, "text": text} for level, text in sorted(found, key=lambda item: item[0] != CRITICAL)]


def health(found_alarms: list[dict]) -> str:
    if any(alarm["level"] == CRITICAL for alarm in found_alarms):
        return "critical"
    return "warning" if found_alarms else "healthy"


def named_groups(page: dict, node: str, node_names: dict) -> list[dict]:
    """A group page's rows with their node's name, their owner's container/link ("owner_label") and its
    client's address and user ("owner_client")."""
    consumers = {consumer["consumer"]: consumer for consumer in page["consumers"]}
    rows = []
    for row in page["groups"]:
        row_node = row.get("node") or node
        owner = consumers.get(row["consumer"], {}) if row["consumer"] is not None else {}
        rows.append({**row, "node": row_node, "node_name": node_names.get(row_node, node_name(row_node)),
                     "owner_label": owner.get("label", ""), "owner_client": owner.get("client", "")})
    return rows


def merge_top(rows: list[dict], order: str, position: int, page_size: int) -> list[dict]:
    """Ranks [position, position + page_size) of the members' top rows merged: each member ranked its own
    groups, so the merge of their first position + page_size is the cluster's. Stable: ties keep the
    order the members were asked in."""
    if order == "owner":
        ranked = sorted(rows, key=lambda row: row["consumer"] or "")  # each node ranked by owner id, as here
    else:
        ranked = sorted(rows, key=ORDER_KEYS[order], reverse=True)
    return ranked[position:position + page_size]


def percentiles(tally: dict) -> dict:
    """{"count", "p50", "p99"} of a LatencyTally snapshot: the upper bound (ms) of the bucket holding
    each quantile; None for a quantile past the last bound or of no observations."""
    count = tally["count"]
    result = {"count": count, "p50": None, "p99": None}
    for name, quantile in (("p50", 0.5), ("p99", 0.99)):
        for bound_ms, cumulative in tally["buckets"]:
            if count and cumulative >= quantile * count:
                result[name] = bound_ms if bound_ms != float("inf") else None
                break
    return result
