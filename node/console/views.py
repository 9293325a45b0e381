"""The console's second-version views: the overview, the queues summed cluster-wide, the hot groups (issue 32).

Rules:
- As node.console's: every answer comes from the admin API called in process as the browser (`admin`, a
  LocalAdmin with the caller's credentials), so its permissions and its cluster spanning apply; only
  this node's refusal counters come from the HTTP server's probe, read as /metrics reads them.
- Each answer that read the members' counters records them in the one RateHistory (node.console.rates),
  under a lock: rates and charts are the node's, whichever page or user asked.
- Hot groups: each member ranks its own groups (GroupPage with an order, node/admin/group_ranks.py) and
  answers its first position + page_size; the merge here is the cluster's ranking. Members are asked at
  once, on the console's small pool; one that fails is named with why, never silently left out.
"""

from __future__ import annotations

import threading

from node.admin.client import AdminClient, AdminError
from node.admin.group_ranks import check_order
import node.console.overview as overview
from node.console.rates import HISTORY_MS, RateHistory

REFUSALS = (("outbound_refused", "sends refused: an owner's forward backlog was full"),
            ("forward_refusals", "forwarded batches refused by this node"))


class Views:
    def __init__(self, probe, pool, member_states):
        """`probe`: the HTTP server's NodeProbe; `pool`: an executor for asking members at once;
        `member_states(status, caller)`: {node: (ready, reason, last_applied, commit_index)}."""
        self._probe = probe
        self._pool = pool
        self._member_states = member_states
        self._history = RateHistory()
        self._lock = threading.Lock()

    def _sample(self, status: dict, now_ms: int) -> tuple[dict, list, dict]:
        """Record the members' counters (and this node's refusals); (rates, series, refusals)."""
        totals = overview.counter_totals(status)
        try:
            cluster = self._probe.metrics_snapshot().get("cluster") or {}
        except TimeoutError:  # the engine loop is slow: no refusal sample this time
            cluster = {}
        for key, what in REFUSALS:
            if key in cluster:
                totals[("refusals", what, "")] = (sum(cluster[key].values()), 0)
        with self._lock:
            self._history.record(now_ms, totals)
            rates = self._history.rates()
            series = self._history.series(now_ms, keep=lambda key: len(key) == 2)
            refusals = {what: self._history.increase(("refusals", what, ""))[0] for _, what in REFUSALS}
        return rates, series, refusals

    def queues(self, admin: AdminClient, now_ms: int) -> dict:
        """Every queue once, summed over the members; each member's share on demand (its "nodes")."""
        note = ""
        try:
            status = admin.cluster_status()
        except AdminError as error:
            if error.status != "PERMISSION_DENIED":
                raise
            status = {"clustered": False, "node": "", "members": [{"node": "", "error": "",
                                                                  "queues": admin.list_queues()}]}
            note = f"only this node's queues: {error.message}"
        rates, _, _ = self._sample(status, now_ms)
        rows, missing = overview.queue_rows(status, rates)
        return {"clustered": status["clustered"], "node": status["node"], "queues": rows, "missing": missing,
                "note": note, "members": [{"node": member["node"], "error": member.get("error", ""),
                                           "queues": member["queues"]} for member in status["members"]]}

    def overview(self, admin: AdminClient, caller, now_ms: int) -> dict:
        status = admin.cluster_status()
        states = self._member_states(status, caller)
        rates, series, refusals = self._sample(status, now_ms)
        rows, missing = overview.queue_rows(status, rates)
        named = overview.names(status)
        found = overview.alarms(status, states, refusals)
        found += [{"level": overview.WARNING, "text": f"node {row['node_name']} did not give its queues: "
                                                      f"{row['error']}"} for row in missing]
        members = [{**{key: member.get(key) for key in ("node", "amqp_address", "down", "connected", "routes",
                                                           "epoch", "in_sync", "under_replicated")},
                    "name": named[member["node"]], "ready": states.get(member["node"], (False, "not asked"))[0],
                    "not_ready_reason": states.get(member["node"], (False, "not asked"))[1],
                    "role": _role(status, member)} for member in status["members"]]
        totals = {key: sum(row[key] for row in rows) for key in ("depth_messages", "depth_bytes", "consumers",
                                                                  "groups", "acquired_messages")}
        totals["queues"] = len(rows)
        for key in ("in_per_s", "out_per_s"):
            known = [row[key] for row in rows if row[key] is not None]
            totals[key] = round(sum(known), 2) if known else None
        return {"clustered": status["clustered"], "node": status["node"],
                "node_name": named.get(status["node"], "this node"), "leader": status.get("leader", ""),
                "leader_name": named.get(status.get("leader", ""), status.get("leader", "")),
                "term": status.get("term", 0), "has_quorum": status.get("has_quorum", False),
                "health": overview.health(found), "alarms": found, "members": members, "totals": totals,
                "queues": rows, "series": [{"age_ms": point["age_ms"], "in_per_s": point["first_per_s"],
                                            "out_per_s": point["second_per_s"]} for point in series],
                "history_ms": HISTORY_MS}

    def ranked_groups(self, admin: AdminClient, queue: str, prefix: str, position: int, page_size: int,
                      order: str, node: str) -> dict:
        """The top groups by `order` of one member (`node`), or of the cluster (node "")."""
        check_order(order, position, page_size)  # before any member is asked: one clear 400, not three
        try:
            status = admin.cluster_status() if not node else None
        except AdminError as error:
            if error.status != "PERMISSION_DENIED":
                raise
            status = None  # a manager of this queue only: this node's groups
        members = [member["node"] for member in status["members"]] if status and status["clustered"] else [node]
        named = overview.names(status) if status else {}
        asked = {member: self._pool.submit(admin.group_page, queue, prefix, 0, position + page_size, member, order)
                 for member in members}
        rows, missing, total = [], [], 0
        for member, answer in asked.items():
            try:
                page = answer.result()
            except AdminError as error:
                if len(members) == 1:
                    raise
                missing.append({"node": member, "node_name": named.get(member, member), "error": error.message})
                continue
            total += page["groups_total"]
            rows += overview.named_groups(page, member, named)
        shown = overview.merge_top(rows, order, position, page_size)
        return {"groups": shown, "next_position": position + len(shown), "groups_total": total, "order": order,
                "missing": missing, "consumers": []}


def _role(status: dict, member: dict) -> str:
    if not status["clustered"]:
        return "alone"
    if member["node"] == status.get("leader"):
        return "leader"
    return "follower" if member.get("raft_member") else "not a raft member"
