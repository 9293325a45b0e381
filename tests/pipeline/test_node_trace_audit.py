"""Node delivery traces judged by `grouper audit`: they must agree with the clients' own logs.

Two real nodes; the traced queue's consumers are on node 1 and its producers on node 0, so every group is
placed on node 1 and every message forwarded there. Midway the busier consumer leaves, so its groups move
to the other and what it held is delivered again. Trace files are a few KiB, so both nodes rotate them
many times during the drill. The drill tools (tests/drills/load.py) write the client logs; the audit runs
once on the nodes' traces and once on the client logs, and every count a broker-side trace can see agrees.
Deliveries are the exception the README names: a message on its way to a consumer whose link ends is a
dropped delivery in the trace that its client never saw, so the trace may count more deliveries.
"""

from __future__ import annotations

import json
import time

import pytest

from node.cli import main
from tests.drills.checker import check, load_jsonl
from tests.drills.load import start_load
from tests.integration.clients import queue_toml
from tests.integration.cluster import Cluster

QUEUE = "traced"
GROUPS = [f"g{index}" for index in range(8)]
SENDS_BEFORE_LEAVING = 200  # accepted sends before a consumer leaves, and again after
RECEIVED_BEFORE_LEAVING = 50  # and deliveries to the consumer that leaves
PROGRESS_TIMEOUT_S = 60.0
TRACE_FILE_MAX_BYTES = 4096  # ~15 lines a file: rotation all through the drill
CONFIG = (f"[node]\ntrace_file_max_bytes = {TRACE_FILE_MAX_BYTES}\ntrace_max_bytes = {64 << 20}\n"
          + queue_toml(QUEUE, trace=True))
# what a node's trace and the clients' logs both see, per queue (pipeline/audit_report.py's keys)
COMPARED = ("sent", "identities_delivered", "delivered", "groups", "consumers", "duplicates_declared")
AT_LEAST = ("deliveries", "redeliveries")  # the trace also sees deliveries the client never received


@pytest.fixture
def cluster(tmp_path):
    made = Cluster(tmp_path / "cluster", 2, CONFIG, ("--no-fsync",))
    yield made.start()
    made.kill_all()


def wait_for_accepted(load, count: int) -> None:
    deadline = time.monotonic() + PROGRESS_TIMEOUT_S
    while load.accepted() < count:
        assert time.monotonic() < deadline, f"only {load.accepted()} of {count} sends accepted in time"
        time.sleep(0.05)


def audit(tmp_path, name: str, *arguments) -> dict:
    out = tmp_path / f"{name}.json"
    status = main(["audit", *map(str, arguments), "--json", str(out)])
    report = json.loads(out.read_text())
    assert status == (0 if report["ok"] else 1)
    return report


def test_the_audit_of_the_nodes_traces_agrees_with_the_audit_of_the_client_logs(spark, cluster, tmp_path):
    producer_node, consumer_node = cluster.nodes
    logs = tmp_path / "logs"
    consumers = start_load([], [(consumer_node.url, QUEUE, 5), (consumer_node.url, QUEUE, 5)], logs)
    cluster.wait_consumers(QUEUE, {0: 0, 1: 2})  # every node knows: new groups go to node 1
    with consumers:
        with start_load([(producer_node.url, QUEUE, GROUPS), (producer_node.url, QUEUE, GROUPS)], [], logs,
                        in_flight_max=10) as producers:
            wait_for_accepted(producers, SENDS_BEFORE_LEAVING)
            deadline = time.monotonic() + PROGRESS_TIMEOUT_S
            while max(consumer.received for consumer in consumers.consumers) < RECEIVED_BEFORE_LEAVING:
                assert time.monotonic() < deadline, "the consumers received too little in time"
                time.sleep(0.05)
            # the busier consumer leaves (the first to grant credit may well own every group); its groups move
            leaving = max(consumers.consumers, key=lambda consumer: consumer.received)
            leaving.stop()
            wait_for_accepted(producers, producers.accepted() + SENDS_BEFORE_LEAVING)
    client_report = check(load_jsonl(producers.send_paths), load_jsonl(consumers.delivery_paths))
    assert client_report.ok and client_report.timed_out == 0, client_report.summary()
    trace_dirs = [node.data_dir / "traces" for node in cluster.nodes]
    # the nodes' writer threads write a moment after the clients saw the outcomes: wait for the last lines

    def traced_lines() -> list[dict]:
        return load_jsonl([path for directory in trace_dirs for path in sorted(directory.glob("*.jsonl"))])

    deadline = time.monotonic() + PROGRESS_TIMEOUT_S
    while True:
        lines = traced_lines()
        node_report = check([line for line in lines if line["kind"] == "send"],
                            [line for line in lines if line["kind"] == "delivery"])
        detached = sum(1 for line in lines if line["kind"] == "detach")
        if (node_report.sends, node_report.delivered, detached) == (client_report.sends, client_report.delivered, 2):
            break
        assert time.monotonic() < deadline, (node_report.summary(), client_report.summary())
        time.sleep(0.1)

    # each node traced what happened on it: the sends where the producers are, the rest where the group is
    nodes_of = {kind: {line["node"] for line in lines if line["kind"] == kind}
                for kind in ("send", "enqueue", "delivery", "attach")}
    producer_id, consumer_id = cluster.node_ids
    assert nodes_of == {"send": {producer_id}, "enqueue": {consumer_id}, "delivery": {consumer_id},
                        "attach": {consumer_id}}
    enqueued = [line for line in lines if line["kind"] == "enqueue"]
    assert len(enqueued) == client_report.accepted
    for directory in trace_dirs:  # rotated: many files, none past its bound
        sizes = [path.stat().st_size for path in directory.glob("*.jsonl")]
        assert len(sizes) >= 3 and max(sizes) <= TRACE_FILE_MAX_BYTES, sizes

    _same_counts(node_report, client_report)
    from_nodes = audit(tmp_path, "nodes", *trace_dirs)
    from_clients = audit(tmp_path, "clients", *consumers.delivery_paths, *consumers.event_paths, "--sends",
                         *producers.send_paths)
    assert from_nodes["ok"] and from_clients["ok"], (from_nodes["broken"], from_clients["broken"])
    (node_queue,), (client_queue,) = from_nodes["queues"], from_clients["queues"]
    assert {key: node_queue[key] for key in COMPARED} == {key: client_queue[key] for key in COMPARED}
    assert all(node_queue[key] >= client_queue[key] for key in AT_LEAST), (node_queue, client_queue)
    assert node_queue["consumers"] == 2 and node_queue["consumer_changes"]["changes"] >= 1  # the groups moved
    assert ({name: verdict["count"] for name, verdict in node_queue["verdicts"].items()}
            == {name: verdict["count"] for name, verdict in client_queue["verdicts"].items()})
    assert from_nodes["lines"]["enqueue"] == client_report.accepted
    assert from_nodes["lines"]["attach"] == from_clients["lines"]["attach"] == 2


def _same_counts(node, client) -> None:
    fields = ("sends", "accepted", "refused", "timed_out", "delivered")
    lists = ("lost", "duplicates", "order_violations", "exclusivity_violations", "refused_delivered", "unexpected",
             "unconfirmed_delivered")
    assert ({name: getattr(node, name) for name in fields} == {name: getattr(client, name) for name in fields}
            and {name: len(getattr(node, name)) for name in lists}
            == {name: len(getattr(client, name)) for name in lists}
            and node.deliveries >= client.deliveries and node.redeliveries >= client.redeliveries), (
        node.summary(), client.summary())

