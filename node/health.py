"""The node's HTTP endpoints for supervisors: /healthz, /readyz and /metrics.

Rules:
- The server runs on its own threads and owns nothing. Every answer comes from `NodeProbe`, whose
  reads of engine loop state go through the bridge with a short deadline, so a scrape never touches a
  proton object or the broker core from this thread.
- /healthz answers 200 while the process serves HTTP: a supervisor restarts a node only when it is
  truly wedged. /readyz answers 200 only when the node can serve (journal recovered, and in a cluster
  joined with a known raft leader and a caught-up replica); otherwise 503 with the reason in one line.
- /metrics is the Prometheus text format, built by `prometheus_client` from one snapshot per scrape.
  An engine loop that does not answer in time makes it 503, not a page of stale numbers.
"""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

log = logging.getLogger("grouper.health")

PROBE_TIMEOUT_MS = 2000  # an engine loop slower than this to answer a probe counts as not ready
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class NodeProbe:
    """What the endpoints ask of a node; runtime.Node provides it."""

    def readiness(self) -> tuple[bool, str]: ...  # (ready, reason when not)

    def metrics_snapshot(self) -> dict: ...  # see GrouperCollector for the keys


class HealthServer:
    def __init__(self, probe, host: str, port: int):
        self._probe = probe
        registry = CollectorRegistry(auto_describe=False)
        registry.register(GrouperCollector(probe))
        self._registry = registry
        handler = type("Handler", (_Handler,), {"server_owner": self})
        self._httpd = ThreadingHTTPServer((host, port), handler)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def answer(self, path: str) -> tuple[int, str, bytes]:
        if path == "/healthz":
            return 200, "text/plain; charset=utf-8", b"ok\n"
        if path == "/readyz":
            ready, reason = self._probe.readiness()
            return (200, "text/plain; charset=utf-8", b"ready\n") if ready else \
                (503, "text/plain; charset=utf-8", f"not ready: {reason}\n".encode())
        if path == "/metrics":
            try:
                return 200, PROMETHEUS_CONTENT_TYPE, generate_latest(self._registry)
            except TimeoutError as error:
                return 503, "text/plain; charset=utf-8", f"metrics unavailable: {error}\n".encode()
        return 404, "text/plain; charset=utf-8", b"not found: try /healthz, /readyz or /metrics\n"


class _Handler(BaseHTTPRequestHandler):
    server_owner: HealthServer
    protocol_version = "HTTP/1.1"

    def do_GET(self):  # noqa: N802 (the standard library's name)
        status, content_type, body = self.server_owner.answer(self.path.split("?", 1)[0])
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):  # probes every few seconds: keep them out of the node's log
        log.debug("%s %s", self.address_string(), format % args)


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
    outbound: {owner: messages}, decisions: {outcome: count}, decision_latency: tally,
    raft: {term, leader, state, has_quorum}}; ready: bool; engine: AmqpServer.engine_objects()
    (connections, links, unsettled_deliveries); resident_bytes: int or None (not Linux).
    """

    def __init__(self, probe):
        self._probe = probe

    def collect(self):
        snapshot = self._probe.metrics_snapshot()
        yield GaugeMetricFamily("grouper_ready", "1 when /readyz would answer 200", value=int(snapshot["ready"]))
        yield from self._queues(snapshot["queues"], snapshot["consumers"])
        yield from self._engine(snapshot["engine"], snapshot["resident_bytes"])
        if snapshot["journal"] is not None:
            yield from self._journal(snapshot["journal"])
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
        yield from (messages_in, messages_out, *gauges.values(), owned)

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
        backlog = GaugeMetricFamily("grouper_forward_backlog_messages",
                                    "messages accepted here waiting for their owner node to take them",
                                    labels=["owner"])
        for owner, depth in sorted(cluster["outbound"].items()):
            backlog.add_metric([owner], depth)
        yield backlog
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
