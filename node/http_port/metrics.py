"""The node's Prometheus metrics: one collector turns one probe snapshot into metric families.

Rules:
- Pure translation: the snapshot (node/http_port/probes.py `metrics_snapshot`) is read once per scrape by
  the server (node/http_port/server.py); nothing here reads the node, the engine loop or the clock.
- Names carry their units (`_bytes`, `_seconds`, `_total`), as Prometheus asks.
"""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily


def _histogram(name: str, documentation: str, tally: dict, labels: dict | None = None,
               family: HistogramMetricFamily | None = None) -> HistogramMetricFamily:
    """A LatencyTally snapshot (milliseconds) as a Prometheus histogram in seconds."""
    if family is None:
        family = HistogramMetricFamily(name, documentation, labels=sorted(labels or {}))
    buckets = [("+Inf" if bound == float("inf") else repr(bound / 1000), count) for bound, count in tally["buckets"]]
    family.add_metric([labels[key] for key in sorted(labels or {})], buckets, tally["sum_ms"] / 1000)
    return family


class GrouperCollector:
    """Turns one `metrics_snapshot()` into metric families. The snapshot's keys:

    queues: [Queue.stats() rows]; consumers: [(queue, consumer label, owned groups)];
    journal: Journal.stats() or None; cluster: None alone, else {routes, waiting_for_route,
    outbound: {owner: messages}, outbound_store: {owner: Outbound.stats() row}, outbound_refused: {owner:
    count}, outbound_max_bytes, outbound_total_max_bytes, moved: {how: count}, cold_sweeps, decisions:
    {outcome: count}, decision_latency: tally,
    raft_decision_latency: tally, raft: {term, leader, state, has_quorum}}; ready: bool; engine:
    AmqpServer.engine_objects() (connections, links, unsettled_deliveries); resident_bytes: int or
    None (not Linux); unrouted: {multicast address: sends discarded for want of a subscription};
    trace: TraceWriter.stats().
    """

    def __init__(self, probe):
        self._probe = probe

    def collect(self):
        snapshot = self._probe.metrics_snapshot()
        yield GaugeMetricFamily("grouper_ready", "1 when /readyz would answer 200", value=int(snapshot["ready"]))
        yield from self._queues(snapshot["queues"], snapshot["consumers"])
        yield from self._group_signals(snapshot["queues"])  # issue 30
        yield from self._engine(snapshot["engine"], snapshot["resident_bytes"])
        unrouted = CounterMetricFamily("grouper_multicast_unrouted_messages", "sends to a multicast address "
                                       "that had no subscription: accepted and discarded", labels=["address"])
        for address, count in sorted(snapshot.get("unrouted", {}).items()):
            unrouted.add_metric([address], count)
        yield unrouted
        if snapshot["journal"] is not None:
            yield from self._journal(snapshot["journal"])
        trace = snapshot.get("trace")
        if trace is not None:  # delivery traces (node/store/trace.py)
            for key, text in (("lines_written", "delivery trace lines written"),
                              ("lines_dropped", "delivery trace lines dropped: the disk refused them, or the "
                                                "writer fell behind by its buffer's bound"),
                              ("files_deleted", "delivery trace files deleted to stay within trace_max_bytes")):
                yield CounterMetricFamily(f"grouper_trace_{key}", text, value=trace[key])
        if snapshot["cluster"] is not None:
            yield from self._cluster(snapshot["cluster"])

    @staticmethod
    def _queues(rows: list[dict], consumers: list):
        messages_in = CounterMetricFamily("grouper_queue_messages_in", "messages enqueued on the queue", labels=["queue"])
        messages_out = CounterMetricFamily("grouper_queue_messages_out",
                                           "deliveries to consumers (redeliveries included)", labels=["queue"])
        gauges = {key: GaugeMetricFamily(f"grouper_queue_{key}", text, labels=["queue"]) for key, text in (
            ("depth_messages", "messages on the queue, acquired ones included"),
            ("depth_bytes", "bytes of message payload on the queue"),
            ("resident_bytes", "bytes of those payloads held in memory"),
            ("paged_bytes", "bytes of those payloads only in the journal, paged out past a memory budget"),
            ("cold_messages", "messages past the node's record budget, only a seq in memory until read back"),
            ("acquired_messages", "messages delivered and not yet settled"),
            ("consumers", "consuming links (browsers excluded)"),
            ("groups", "groups the queue tracks"),
            ("owned_groups", "groups that have an owner (a consumer)"))}
        for row in rows:
            messages_in.add_metric([row["name"]], row["enqueued_total"])
            messages_out.add_metric([row["name"]], row["delivered_total"])
            for key, family in gauges.items():
                family.add_metric([row["name"]], row[key])
        owned = GaugeMetricFamily("grouper_consumer_owned_groups", "groups each consumer owns",
                                  labels=["queue", "consumer"])
        for queue, consumer, count in consumers:
            owned.add_metric([queue, consumer], count)
        # issue 31: resends a de-duplicating queue accepted and did not queue again (node/core/dispatch/dedup.py)
        dedup_dropped = CounterMetricFamily("grouper_queue_dedup_dropped_messages", "resends of an id the queue "
                                            "took within its de-duplication window: accepted, not queued again",
                                            labels=["queue"])
        for row in rows:
            dedup_dropped.add_metric([row["name"]], row.get("dedup_dropped_total", 0))
        yield from (messages_in, messages_out, *gauges.values(), owned, dedup_dropped)

    @staticmethod
    def _group_signals(rows: list[dict]):
        """Issue 30, group signals (node/core/dispatch/group_signals.py). The oldest head is a timestamp, as
        Prometheus asks for ages: its age is `time() - grouper_queue_oldest_head_enqueued_timestamp_seconds`,
        exported only for queues that have a message waiting at a group's head."""
        gauges = {key: GaugeMetricFamily(f"grouper_queue_{key}", text, labels=["queue"]) for key, text in (
            ("runnable_groups", "groups whose next message is available and that no consumer has: a consumer "
                                "with credit would get one at once (the ceiling on useful new consumers)"),
            ("blocked_groups", "groups whose next message waits: on a consumer with no credit, paused by a "
                               "rebalance or reset, held for a move, delayed, or selected by no consumer"),
            ("held_groups", "groups that have a consumer"))}
        oldest = GaugeMetricFamily("grouper_queue_oldest_head_enqueued_timestamp_seconds",
                                   "arrival time of the oldest message waiting at a group's head (unix seconds)",
                                   labels=["queue"])
        for row in rows:
            for key, family in gauges.items():
                family.add_metric([row["name"]], row.get(key, 0))
            if row.get("oldest_head_enqueued_at_ms"):
                oldest.add_metric([row["name"]], row["oldest_head_enqueued_at_ms"] / 1000)
        yield from (*gauges.values(), oldest)

    @staticmethod
    def _engine(engine: dict, resident_bytes: int | None):
        # what the loop holds of proton's C objects, which the node frees itself: flat under a steady
        # load, back to the idle baseline once clients leave, or something leaks
        for key, text in (("connections", "AMQP connections whose engine objects the loop still holds"),
                          ("links", "attached links (consumers and producers)"),
                          ("unsettled_deliveries", "deliveries sent to consumers and not yet settled")):
            yield GaugeMetricFamily(f"grouper_engine_{key}", text, value=engine[key])
        if resident_bytes is not None:
            yield GaugeMetricFamily("grouper_process_resident_bytes", "resident set size of the node process",
                                    value=resident_bytes)

    @staticmethod
    def _journal(stats: dict):
        yield _histogram("grouper_journal_fsync_latency_seconds", "time of each journal fsync",
                         stats["fsync_latency"])
        for key, text in (("file_bytes", "size of the journal file"), ("live_bytes", "bytes of live records"),
                          ("backlog_bytes", "records handed to the journal and not yet written")):
            yield GaugeMetricFamily(f"grouper_journal_{key}", text, value=stats[key])
        for key, text in (("batches_written", "journal batches written"),
                          ("failed_batches", "journal batches whose write or fsync failed"),
                          ("compactions", "journal compactions")):
            yield CounterMetricFamily(f"grouper_journal_{key}", text, value=stats[key])

    @staticmethod
    def _outbound_store(cluster: dict):
        """The forwarding backlog in bytes per owner: all of it (what outbound_max_bytes bounds), the part
        whose bodies are in memory (outbound_memory_max_bytes pages the rest of a durable backlog) and
        the part journalled."""
        store = cluster.get("outbound_store", {})
        for key, text in (
                ("bytes", "payload bytes accepted here waiting for their owner node to take them (bounded by "
                          "outbound_max_bytes)"),
                ("memory_bytes", "of the forward backlog's bytes, those held in this node's memory"),
                ("memory_messages", "of the forward backlog's messages, those held in this node's memory"),
                ("journal_bytes", "of the forward backlog's bytes, those in this node's journal (durable queues)"),
                ("journal_messages", "of the forward backlog's messages, those in this node's journal")):
            family = GaugeMetricFamily(f"grouper_forward_backlog_{key}", text, labels=["owner"])
            for owner, stats in sorted(store.items()):
                family.add_metric([owner], stats[key])
            yield family
        refused = CounterMetricFamily("grouper_forward_backlog_refused_messages",
                                      "sends refused because the owner's forward backlog was at its bound",
                                      labels=["owner"])
        for owner, count in sorted(cluster.get("outbound_refused", {}).items()):
            refused.add_metric([owner], count)
        yield refused
        forwarding_refused = CounterMetricFamily(
            "grouper_forward_refused_calls", "forwarded batches this node refused: caller (no valid credential, "
            "no node certificate, no raft member) or seq_jump (a seq at or above its batch's bound)", labels=["reason"])
        for reason, count in sorted(cluster.get("forward_refusals", {}).items()):
            forwarding_refused.add_metric([reason], count)
        yield forwarding_refused
        yield CounterMetricFamily("grouper_forward_marks_set_back", "sources whose mark here was above their own seq "
                                  "bound (a forged batch taken as theirs) and was set back",
                                  value=cluster.get("forward_marks_set_back", 0))
        for key, text in (("outbound_max_bytes", "bound of the forward backlog per owner node; 0 = none"),
                          ("outbound_total_max_bytes", "bound of the forward backlog of all owners; 0 = none"),
                          ("outbound_max_messages", "bound of the forward backlog per owner node in messages; "
                                                    "0 = none"),
                          ("outbound_memory_max_bytes", "bodies of one owner's forward backlog kept in memory; "
                                                        "the rest is paged to the journal; 0 = none")):
            if key in cluster:
                yield GaugeMetricFamily(f"grouper_{key}", text, value=cluster[key])

    @staticmethod
    def _cluster(cluster: dict):
        yield GaugeMetricFamily("grouper_routes", "group routes this node knows", value=cluster["routes"])
        yield GaugeMetricFamily("grouper_messages_waiting_for_route", "messages waiting for a route decision",
                                value=cluster["waiting_for_route"])
        decisions = CounterMetricFamily("grouper_route_decisions", "waits for a group's route, by outcome",
                                        labels=["outcome"])
        for outcome, count in sorted(cluster["decisions"].items()):
            decisions.add_metric([outcome], count)
        yield decisions
        yield _histogram("grouper_route_decision_latency_seconds",
                         "from a message of an unrouted group arriving to its route being known here",
                         cluster["decision_latency"])
        yield _histogram("grouper_raft_decision_latency_seconds",
                         "from this node proposing a new group's route to raft to the decided route arriving here",
                         cluster["raft_decision_latency"])
        backlog = GaugeMetricFamily("grouper_forward_backlog_messages",
                                    "messages accepted here waiting for their owner node to take them",
                                    labels=["owner"])
        for owner, depth in sorted(cluster["outbound"].items()):
            backlog.add_metric([owner], depth)
        yield backlog
        yield from GrouperCollector._outbound_store(cluster)
        moved = CounterMetricFamily("grouper_moved_messages", "messages of groups following their consumers, by "
                                    "how: handed over from the queue or its cold tail, relayed, parked, or "
                                    "recovered here and sent to their group's owner", labels=["how"])
        for how, count in sorted(cluster.get("moved", {}).items()):
            moved.add_metric([how], count)
        yield moved
        yield CounterMetricFamily("grouper_cold_sweeps", "passes through a cold tail for groups moving away",
                                  value=cluster.get("cold_sweeps", 0))
        raft = cluster["raft"]
        if raft is not None:
            yield GaugeMetricFamily("grouper_raft_term", "current raft term", value=raft["term"])
            yield GaugeMetricFamily("grouper_raft_is_leader", "1 on the raft leader (the grouping handler)",
                                    value=int(raft["state"] == "leader"))
            yield GaugeMetricFamily("grouper_raft_has_quorum", "1 while a majority is reachable",
                                    value=int(raft["has_quorum"]))
            leader = GaugeMetricFamily("grouper_raft_leader", "the leader this node knows (value 1; label the id)",
                                       labels=["leader"])
            leader.add_metric([raft["leader"]], 1)
            yield leader
            # issue 32: what deploy/prometheus/grouper-rules.yml's GrouperRaftMemberLagging compares
            for key, text in (("commit_index", "the raft log index this member knows committed"),
                              ("last_applied", "the raft log index this member applied; behind the cluster's "
                                               "highest commit index while it lags")):
                if key in raft:
                    yield GaugeMetricFamily(f"grouper_raft_{key}", text, value=raft[key])
            if "connected" in raft:
                yield GaugeMetricFamily("grouper_raft_members", "members of the raft configuration, this one "
                                        "included", value=len(raft["members"]))
                yield GaugeMetricFamily("grouper_raft_connected_members", "other members this one is connected "
                                        "to", value=len(raft["connected"]))
            if "decision_latency" in raft:  # absent from a member of an older release
                yield _histogram("grouper_raft_member_decision_latency_seconds",
                                 "the raft part of a route decision: from this node's claim reaching its raft member "
                                 "to the decided route being applied there",
                                 raft["decision_latency"])
