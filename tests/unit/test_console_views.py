"""The console's server-side aggregation (node.console.overview, node.console.rates, node.console.views):
queues summed cluster-wide with their rates, nodes and owners named for people, alarms, and the hot
groups merged from each member's own ranking."""

from __future__ import annotations

from concurrent import futures

from hypothesis import given, settings, strategies as st

from node.console import overview
from node.console.rates import HISTORY_MS, SAMPLE_SPACING_MIN_MS, RateHistory
from node.console.views import Views

A, B, C = "10.0.0.1:5674", "10.0.0.2:5674", "10.0.0.3:5674"


def stats(name: str, depth: int, enqueued: int, delivered: int) -> dict:
    return {"name": name, "depth_messages": depth, "depth_bytes": 10 * depth, "acquired_messages": 0,
            "consumers": 1, "browsers": 0, "groups": depth, "owned_groups": 0, "enqueued_total": enqueued,
            "delivered_total": delivered, "resident_bytes": 0, "paged_bytes": 0, "cold_messages": 0}


def status(queues_by_node: dict, **member_fields) -> dict:
    members = []
    for node, queues in queues_by_node.items():
        members.append({"node": node, "amqp_address": node.replace("5674", "5672"), "error": "", "queues": queues,
                        "down": False, "connected": True, "raft_member": True, "routes": 0, "epoch": 0,
                        "in_sync": [], "under_replicated": False, **member_fields.get(node, {})})
    return {"clustered": True, "node": A, "leader": A, "term": 3, "has_quorum": True, "members": members,
            "last_applied": 10, "commit_index": 10}


def test_a_queue_is_one_row_summed_over_the_nodes_with_each_node_s_share_and_rate():
    history = RateHistory()
    history.record(0, overview.counter_totals(status({A: [stats("orders", 1, 100, 90)], B: [stats("orders", 2, 0, 0)]})))
    later = status({A: [stats("orders", 3, 150, 120)], B: [stats("orders", 4, 20, 10)], C: []})
    history.record(2000, overview.counter_totals(later))
    rows, missing = overview.queue_rows(later, history.rates())
    assert missing == []
    [row] = rows
    assert (row["name"], row["depth_messages"], row["enqueued_total"]) == ("orders", 7, 170)
    assert (row["in_per_s"], row["out_per_s"]) == (35.0, 20.0)  # (50 + 20) / 2 s, (30 + 10) / 2 s
    assert [(node["node"], node["node_name"], node["in_per_s"]) for node in row["nodes"]] \
        == [(A, "10.0.0.1:5672", 25.0), (B, "10.0.0.2:5672", 10.0)]


def test_a_rate_shows_from_the_node_s_samples_on_a_page_s_first_load():
    # the first console took rates between a page's own two polls: a fresh page showed none
    history = RateHistory()
    assert history.rates() == {}
    history.record(0, {(A, "q"): (10, 5)})
    history.record(SAMPLE_SPACING_MIN_MS - 1, {(A, "q"): (99, 99)})  # too soon: not kept
    history.record(4000, {(A, "q"): (30, 9)})
    assert history.rates() == {(A, "q"): (5.0, 1.0)}


def test_a_node_that_restarted_counts_from_zero_and_a_new_key_waits_for_its_second_sample():
    history = RateHistory()
    history.record(0, {(A, "q"): (1000, 1000)})
    history.record(1000, {(A, "q"): (7, 3), (B, "q"): (50, 50)})
    assert history.rates() == {(A, "q"): (7.0, 3.0)}


@settings(max_examples=50, deadline=None)
@given(gaps=st.lists(st.integers(0, 120_000), min_size=1, max_size=40), rate=st.integers(0, 100))
def test_the_history_is_bounded_and_its_series_shows_a_steady_rate(gaps, rate):
    history = RateHistory()
    now_ms = 0
    for gap_ms in gaps:
        now_ms += gap_ms
        history.record(now_ms, {(A, "q"): (rate * now_ms // 1000, 0)})
    series = history.series(now_ms)
    assert all(point["age_ms"] <= HISTORY_MS for point in series)
    assert all(abs(point["first_per_s"] - rate) <= 1 for point in series)
    assert len(series) <= HISTORY_MS // SAMPLE_SPACING_MIN_MS


def test_nodes_are_named_by_their_host_name_else_their_amqp_address():
    assert overview.node_name("grouper-1.grouper.prod.svc.cluster.local:5674", "x:5672") == "grouper-1"
    assert overview.node_name("127.0.0.1:5674", "127.0.0.1:5672") == "127.0.0.1:5672"
    assert overview.node_name("[::1]:5674", "") == "[::1]:5674"
    assert overview.node_name("", "") == ""


def test_alarms_name_a_node_down_a_lagging_member_an_under_replicated_owner_and_refusals():
    cluster = status({A: [], B: [], C: []}, **{B: {"down": True}, C: {"under_replicated": True, "in_sync": [A]}})
    states = {A: (True, "", 5000, 5000), B: (False, "does not answer", 0, 0), C: (True, "", 3000, 4990)}
    found = overview.alarms(cluster, states, {"sends refused: forward backlog full": 4, "other": 0})
    texts = [alarm["text"] for alarm in found]
    assert found[0]["level"] == "critical" and texts[0].startswith("node 10.0.0.2:5672 (10.0.0.2:5674) is down")
    assert "node 10.0.0.3:5672's raft member lags: 2000 log entries behind the commit index" in texts
    assert "node 10.0.0.3:5672 owns groups under-replicated: its in-sync backups are 10.0.0.1:5672 (epoch 0)" in texts
    assert "4 sends refused: forward backlog full in the last minutes" in texts
    assert len(texts) == 4 and overview.health(found) == "critical"
    assert overview.alarms(status({A: []}), {A: (True, "", 1, 1)}, {}) == []
    assert overview.alarms({**status({A: []}), "leader": ""}, {}, {})[0]["text"].startswith("no raft leader")


class FakeAdmin:
    """group_page and cluster_status as AdminClient answers them, from per-node rows."""

    def __init__(self, rows_by_node: dict):
        self.rows_by_node = rows_by_node
        self.asked = []

    def cluster_status(self):
        return status({node: [] for node in self.rows_by_node})

    def group_page(self, queue, prefix, position, page_size, node, order):
        self.asked.append((node, position, page_size, order))
        rows = sorted(self.rows_by_node[node], key=lambda row: -row["messages"])[:page_size]  # the node's own top
        return {"groups": [{**row, "node": node} for row in rows], "groups_total": len(self.rows_by_node[node]),
                "next_position": len(rows), "scanned": 0,
                "consumers": [{"consumer": "7", "label": "billing-app/orders-in", "client": "10.1.2.3:50001 (billing)"}]}


def group(name: str, messages: int, consumer=None) -> dict:
    return {"group": name, "messages": messages, "acquired": 0, "consumer": consumer, "head_age_ms": None}


def test_hot_groups_merge_each_member_s_top_into_the_cluster_s_and_name_their_owners():
    admin = FakeAdmin({A: [group("a1", 5), group("a2", 50, "7"), group("a3", 1)],
                       B: [group("b1", 30), group("b2", 40)], C: [group("c1", 45)]})
    with futures.ThreadPoolExecutor(2) as pool:
        views = Views(probe=None, pool=pool, member_states=None)
        page = views.ranked_groups(admin, "orders", "", 1, 3, "backlog", "")
    assert [(row["group"], row["messages"]) for row in page["groups"]] == [("c1", 45), ("b2", 40), ("b1", 30)]
    assert page["groups_total"] == 6 and page["next_position"] == 4
    assert {asked[1:] for asked in admin.asked} == {(0, 4, "backlog")}  # each member its first 4 only
    with futures.ThreadPoolExecutor(2) as pool:
        top = Views(None, pool, None).ranked_groups(admin, "orders", "", 0, 1, "backlog", "")["groups"][0]
    assert (top["group"], top["owner_label"], top["owner_client"], top["node_name"]) \
        == ("a2", "billing-app/orders-in", "10.1.2.3:50001 (billing)", "10.0.0.1:5672")
