"""The load driver and the checker against one real node: a clean run, refusals, and kill -9 with restart.

Each run is a few seconds of real traffic; every wait is bounded. A failure prints the checker's
summary, which names the first examples of each violation.
"""

from __future__ import annotations

import time
import urllib.request
from collections import Counter

from tests.drills.checker import check_files, load_jsonl
from tests.drills.load import GroupedProducer, LoggingConsumer, drain, run_load, start_load
from tests.integration.clients import queue_toml

QUEUE = "drill"
GROUPS = [f"g{index}" for index in range(20)]
PROGRESS_TIMEOUT_S = 10.0  # bound of every wait for the load to make progress


def engine_gauges(node) -> str:
    """The node's own count of connections, links and unsettled deliveries, for a failure message."""
    try:
        with urllib.request.urlopen(f"http://{node.http_address}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError as error:
        return f"no metrics: {error}"
    return "; ".join(line for line in text.splitlines() if line.startswith("grouper_engine_"))


def wait_for_connects(clients, wanted: dict[str, int]) -> bool:
    """Wait (bounded) until each client has opened at least `wanted[name]` connections."""
    deadline = time.monotonic() + PROGRESS_TIMEOUT_S
    while not all(thread.connects >= wanted[thread.name] for thread in clients):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def wait_for_accepted(load, count: int) -> None:
    deadline = time.monotonic() + PROGRESS_TIMEOUT_S
    while load.accepted() < count:
        assert time.monotonic() < deadline, f"only {load.accepted()} of {count} sends accepted in time"
        time.sleep(0.05)


def test_two_producers_and_three_consumers_on_a_shared_queue_lose_nothing_and_keep_order(node_factory, tmp_path):
    node = node_factory(queue_toml(QUEUE, group_policy="shared"))
    producers = [(node.url, QUEUE, GROUPS)] * 2
    consumers = [(node.url, QUEUE, 10), (node.url, QUEUE, 5, 2), (node.url, QUEUE, 1)]

    send_paths, delivery_paths = run_load(producers, consumers, 2.5, tmp_path)

    report = check_files(send_paths, delivery_paths)
    assert report.ok, report.summary()
    assert report.accepted > 200 and report.accepted == report.sends == report.delivered, report.summary()
    assert report.redeliveries == 0, report.summary()
    sends = load_jsonl(send_paths)
    for producer in ("p0", "p1"):
        for group in GROUPS:
            sequences = [line["sequence"] for line in sends if (line["producer"], line["group"]) == (producer, group)]
            assert sequences == list(range(1, len(sequences) + 1)), (producer, group, sequences[:10])
    deliveries = load_jsonl(delivery_paths)
    assert all(line["settle_confirmed"] for line in deliveries)
    assert len({line["consumer"] for line in deliveries}) == 3, "a consumer got nothing"


def test_refused_sends_are_logged_with_their_condition_not_resent_and_not_counted_lost(node_factory, tmp_path):
    node = node_factory(queue_toml(QUEUE, depth_max_messages=5))
    producer = GroupedProducer(node.url, QUEUE, ["a", "b"], tmp_path / "p.jsonl", name="p", messages_max=20,
                               in_flight_max=1, seed=7)
    producer.start()
    producer.join(PROGRESS_TIMEOUT_S)
    assert not producer.is_alive(), "the producer did not finish its 20 messages"
    producer.stop()
    sends = load_jsonl(producer.log_path)
    assert Counter(line["outcome"] for line in sends) == {"accepted": 5, "rejected": 15}
    assert {line["condition"] for line in sends if line["outcome"] == "rejected"} == {"amqp:resource-limit-exceeded"}
    for group in ("a", "b"):
        sequences = [line["sequence"] for line in sends if line["group"] == group]
        assert sequences == list(range(1, len(sequences) + 1))

    consumer = LoggingConsumer(node.url, QUEUE, tmp_path / "c.jsonl", name="c", credit=3)
    consumer.start()
    try:
        deadline = time.monotonic() + PROGRESS_TIMEOUT_S
        while consumer.received < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert drain([consumer], quiet_s=0.3, timeout_s=PROGRESS_TIMEOUT_S)
    finally:
        consumer.stop()

    report = check_files([producer.log_path], [consumer.log_path])
    assert report.ok, report.summary()
    assert (report.accepted, report.refused, report.delivered) == (5, 15, 5)


def test_kill_9_and_restart_under_load_loses_no_accepted_message_and_breaks_no_order(node_factory, tmp_path):
    node = node_factory(queue_toml(QUEUE, durable=True))
    producers = [(node.url, QUEUE, GROUPS)] * 2
    consumers = [(node.url, QUEUE, 10), (node.url, QUEUE, 10, 2), (node.url, QUEUE, 3)]

    with start_load(producers, consumers, tmp_path, in_flight_max=50, reconnect_delay_max_s=0.5) as load:
        clients = [*load.producers, *load.consumers]
        wait_for_accepted(load, 300)
        # 300 sends can be accepted before a consumer's first connection has had its open: the kill would
        # then cut a handshake, and that client's first connection would be its first after the restart
        assert wait_for_connects(clients, {thread.name: 1 for thread in clients}), [thread.state() for thread in clients]
        connects_before = {thread.name: thread.connects for thread in clients}
        node.kill()
        before_restart = load.accepted()
        node.start()
        wait_for_accepted(load, before_restart + 300)
        # the producers may send 300 before a consumer's backoff has ended: wait for every client's
        # reconnection (bounded), then for traffic that every consumer can take part in
        reconnected = wait_for_connects(clients, {name: count + 1 for name, count in connects_before.items()})
        assert reconnected, "\n".join(
            [thread.state() for thread in clients] + [engine_gauges(node), "node output (last 30 lines):",
                                                      *node.output[-30:]])
        wait_for_accepted(load, load.accepted() + 100)

    report = check_files(load.send_paths, load.delivery_paths)
    assert report.ok, report.summary()
    # what is unconfirmed is explained by the crash, and nothing else is
    deliveries = load_jsonl(load.delivery_paths)
    unconfirmed = [line for line in deliveries if not line["settle_confirmed"]]
    assert len(unconfirmed) <= sum(credit for _, _, credit, *_ in consumers), report.summary()
    print(report.summary(), f"; {len(unconfirmed)} deliveries cut off by the crash")
