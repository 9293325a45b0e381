"""The benchmark's clients and one row's measurement: a producer process and consumer process(es).

The producer runs in its own process and the consumers in one or more others (multiprocessing, fork;
one connection per consumer); each process reports its own CPU time, so the table can say how much
of the machine the clients took. AMQP 1.0 clients are lean.py's (proton's C engine, no reactor: a
few us of client CPU per message, where a proton Container took 300-1,000); STOMP clients (for
ActiveMQ) use stomp.py. Both carry the same payload: a 100-byte body, the group id, the message's
sequence number within its group and the producer's send time (CLOCK_MONOTONIC, which is
machine-wide on Linux, so consumers in other processes can subtract it).

This module moves messages and writes what it saw; it never starts brokers (peers.py) and never
formats tables (run.py).
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import random
import threading
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path

from node.client.encoding import SENT_KEY, SEQ_KEY  # the application properties the lean client encodes

try:
    import stomp
except ImportError:  # only the ActiveMQ rows need it; they fail with this reason if it is missing
    stomp = None

READY_TIMEOUT_S = 60  # consumers attached and producer connected
STALL_TIMEOUT_S = 30  # no message accepted anywhere for this long ends the row as failed
JOIN_TIMEOUT_S = 20
POLL_INTERVAL_S = 0.02

GROUP_KEY = "bench_group"  # STOMP only: ActiveMQ does not hand JMSXGroupID back to STOMP consumers


@dataclass(frozen=True)
class Workload:
    messages: int
    groups: int
    prefetch: int
    durable: bool
    consumers: int = 4
    body_bytes: int = 100
    seed: int = 1
    rate_per_s: int = 0  # the producer's send rate (AMQP only); 0: as fast as credit and window allow


def plan(workload: Workload) -> tuple[list[str], array]:
    """The group of each message (seeded random) and its sequence number within its group."""
    rng = random.Random(workload.seed)
    names = [f"g{index:04d}" for index in range(workload.groups)]
    next_seq = [0] * workload.groups
    groups, seqs = [], array("q")
    for _ in range(workload.messages):
        index = rng.randrange(workload.groups)
        groups.append(names[index])
        seqs.append(next_seq[index])
        next_seq[index] += 1
    return groups, seqs


def _cpu_s() -> float:
    times = os.times()
    return times.user + times.system


# --- STOMP (stomp.py, for ActiveMQ Classic) ----------------------------------------------------

def _stomp_connection(target):
    host, port = target.url.rsplit(":", 1)
    connection = stomp.Connection([(host, int(port))], heartbeats=(0, 0), auto_decode=False)
    return connection


def stomp_producer(target, workload: Workload, go, result_path: str) -> None:
    groups, seqs = plan(workload)
    body = b"x" * workload.body_bytes
    persistent = "true" if workload.durable else "false"
    connection = _stomp_connection(target)
    result = {"sent": 0, "accepted": 0, "rejected": 0, "released": 0, "first_send_ns": 0, "last_send_ns": 0,
              "error": ""}
    try:
        connection.connect(wait=True)
        go.wait()
        cpu_start = _cpu_s()
        send, destination = connection.send, target.send_address
        start_ns, rate = time.monotonic_ns(), workload.rate_per_s
        for number in range(workload.messages):
            group = groups[number]
            now = time.monotonic_ns()
            if rate and now < start_ns + number * 1_000_000_000 // rate:  # a paced row: wait for this send's turn
                time.sleep((start_ns + number * 1_000_000_000 // rate - now) / 1e9)
                now = time.monotonic_ns()
            # Fire-and-forget sends (no receipt): a receipt per SEND would make each one synchronous.
            send(destination, body, headers={"JMSXGroupID": group, GROUP_KEY: group, SEQ_KEY: seqs[number],
                                             SENT_KEY: now, "persistent": persistent})
            if number == 0:
                result["first_send_ns"] = now
        result["last_send_ns"] = time.monotonic_ns()
        result["sent"] = workload.messages
        connection.disconnect()  # waits for the broker's receipt of DISCONNECT: every SEND was read
        result["cpu_s"] = _cpu_s() - cpu_start
    except Exception as error:
        result["error"] = f"{type(error).__name__}: {error}"
        result.setdefault("cpu_s", 0.0)
    _dump(result_path, result)


def stomp_consumers(target, indexes: list, workload: Workload, readies, stop, progress, result_paths) -> None:
    """Consumers `indexes` in one process, one STOMP connection (and stomp.py reader thread) each."""
    records = {index: _Record() for index in indexes}
    connections = {}
    subscribed = {index: threading.Event() for index in indexes}

    class Listener(stomp.ConnectionListener):
        def __init__(self, index: int, connection):
            self.index, self.connection, self.record = index, connection, records[index]

        def on_message(self, frame):
            received_ns = time.monotonic_ns()
            headers = frame.headers
            self.connection.ack(headers["message-id"], headers["subscription"])
            self.record.add(headers.get(GROUP_KEY), int(headers.get(SEQ_KEY, -1)), int(headers.get(SENT_KEY, 0)),
                            received_ns)
            progress[self.index] = self.record.count

        def on_receipt(self, frame):
            subscribed[self.index].set()

        def on_error(self, frame):
            body = frame.body.decode(errors="replace") if isinstance(frame.body, bytes) else str(frame.body)
            self.record.error = body or str(frame.headers.get("message"))

    cpu_start_s = _cpu_s()
    try:
        for index in indexes:
            connection = connections[index] = _stomp_connection(target)
            connection.set_listener("bench", Listener(index, connection))
            connection.connect(wait=True)
            for number, destination in enumerate(target.consumer_addresses[index]):
                # One subscription per consumer here, so one receipt marks the consumer attached.
                connection.subscribe(destination, id=f"c{index}-{number}", ack="client-individual",
                                     headers={"activemq.prefetchSize": str(workload.prefetch),
                                              "receipt": f"subscribed-{index}-{number}"})
        for index in indexes:
            if subscribed[index].wait(READY_TIMEOUT_S):
                readies[index].set()
        cpu_start_s = _cpu_s()
        stop.wait()
        for connection in connections.values():
            connection.disconnect()
    except Exception as error:
        for record in records.values():
            record.error = record.error or f"{type(error).__name__}: {error}"
    _dump_records(records, result_paths, _cpu_s() - cpu_start_s)


def _dump_records(records: dict, result_paths, process_cpu_s: float) -> None:
    # The process's CPU is shared by its consumers; only the sum over all processes is reported.
    for index, record in records.items():
        record.cpu_s = process_cpu_s / len(records)
        _dump(result_paths[index], record.as_dict())


# --- what a consumer saw -----------------------------------------------------------------------

class _Record:
    def __init__(self):
        self.count = 0
        self.groups: list[str] = []
        self.seqs = array("q")
        self.received_ns = array("q")
        self.latencies_ns = array("q")
        self.last_accept_ns = 0
        self.error = ""
        self.cpu_s = 0.0

    def add(self, group, seq: int, sent_ns: int, received_ns: int) -> None:
        self.count += 1
        self.groups.append(group)
        self.seqs.append(seq)
        self.received_ns.append(received_ns)
        self.latencies_ns.append(received_ns - sent_ns)
        self.last_accept_ns = time.monotonic_ns()

    def as_dict(self) -> dict:
        return {"count": self.count, "groups": self.groups, "seqs": self.seqs, "received_ns": self.received_ns,
                "latencies_ns": self.latencies_ns, "last_accept_ns": self.last_accept_ns, "error": self.error,
                "cpu_s": self.cpu_s}


def _dump(path: str, value: dict) -> None:
    with open(path, "wb") as handle:
        pickle.dump(value, handle, protocol=pickle.HIGHEST_PROTOCOL)


def _load(path: Path) -> dict | None:
    try:
        with open(path, "rb") as handle:
            return pickle.load(handle)
    except (OSError, EOFError, pickle.UnpicklingError):
        return None


# --- one row -----------------------------------------------------------------------------------

@dataclass
class RowOutcome:
    received: int = 0
    unique: int = 0
    duplicates: int = 0
    lost: int = 0
    throughput_per_s: float = 0.0
    producer_send_s: float = 0.0  # first to last send: how far the broker let the producer run ahead
    latency_p50_ms: float = 0.0
    latency_p99_ms: float = 0.0
    broker_cpu_us_per_msg: float = 0.0
    client_cpu_us_per_msg: float = 0.0
    order_violations: int = 0
    groups_split: int = 0
    groups_seen: int = 0
    per_consumer: list = field(default_factory=list)
    groups_per_consumer: list = field(default_factory=list)  # groups each consumer received (first holder counts)
    errors: list = field(default_factory=list)


def measure(target, workload: Workload, broker_cpu_s, scratch_dir: Path, consumer_processes: int) -> RowOutcome:
    """Run one row: attach consumers, then release the producer, wait for every message or a stall.

    The consumers are spread round-robin over `consumer_processes` processes; the producer has its own.
    """
    from bench import lean  # here, in the parent, so that forked client processes do not pay (and count) the import

    context = multiprocessing.get_context("fork")
    producer_main = lean.producer if target.protocol == "amqp" else stomp_producer
    consumers_main = lean.consumers if target.protocol == "amqp" else stomp_consumers
    scratch_dir.mkdir(parents=True, exist_ok=True)
    go, stop = context.Event(), context.Event()
    progress = context.RawArray("q", workload.consumers)
    readies = [context.Event() for _ in range(workload.consumers)]
    consumer_paths = [str(scratch_dir / f"consumer{index}.pickle") for index in range(workload.consumers)]
    producer_path = scratch_dir / "producer.pickle"
    process_count = max(1, min(consumer_processes, workload.consumers))
    consumers = [context.Process(target=consumers_main, name=f"bench-consumers{number}",
                                 args=(target, list(range(number, workload.consumers, process_count)), workload,
                                       readies, stop, progress, consumer_paths))
                 for number in range(process_count)]
    producer = context.Process(target=producer_main, name="bench-producer",
                               args=(target, workload, go, str(producer_path)))
    outcome = RowOutcome()
    broker_cpu_used_s = 0.0
    for path in [*consumer_paths, producer_path]:
        Path(path).unlink(missing_ok=True)
    for process in consumers:
        process.start()
    producer.start()
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not all(ready.is_set() for ready in readies):
            if not all(process.is_alive() for process in consumers):  # refused (a login, a link): said below
                outcome.errors.append("consumers ended before they all attached")
                break
            if time.monotonic() > deadline:
                outcome.errors.append(f"consumers did not attach within {READY_TIMEOUT_S} s")
                break
            time.sleep(POLL_INTERVAL_S)
        if not outcome.errors:
            time.sleep(0.2)  # let the broker finish registering subscriptions before the first message
            cpu_before = broker_cpu_s()
            go.set()
            _wait_for_all(workload.messages, progress, producer, outcome)
            broker_cpu_used_s = broker_cpu_s() - cpu_before
    finally:
        go.set()  # a producer still waiting must be able to run to its end
        stop.set()
        for process in [*consumers, producer]:
            process.join(JOIN_TIMEOUT_S)
            if process.is_alive():
                process.terminate()
                process.join(5)
                outcome.errors.append(f"{process.name} did not finish; terminated")
    _summarize(outcome, workload, broker_cpu_used_s, _load(producer_path),
               [_load(Path(path)) for path in consumer_paths])
    return outcome


def _wait_for_all(total: int, progress, producer, outcome: RowOutcome) -> None:
    last_count, last_change = -1, time.monotonic()
    while True:
        count = sum(progress)
        if count >= total:
            return
        now = time.monotonic()
        if count != last_count:
            last_count, last_change = count, now
        elif now - last_change > STALL_TIMEOUT_S:
            outcome.errors.append(f"stalled: {count}/{total} received, nothing for {STALL_TIMEOUT_S} s")
            return
        if not producer.is_alive() and producer.exitcode not in (0, None):
            outcome.errors.append(f"producer exited with {producer.exitcode}")
            return
        time.sleep(POLL_INTERVAL_S)


def _percentile(values: list, fraction: float) -> float:
    if not values:
        return 0.0
    return values[min(len(values) - 1, int(fraction * len(values)))]


def _summarize(outcome: RowOutcome, workload: Workload, broker_cpu_s: float, producer: dict | None,
               consumers: list) -> None:
    if producer is None:
        outcome.errors.append("producer wrote no result")
        producer = {"first_send_ns": 0, "cpu_s": 0.0, "error": ""}
    if producer.get("error"):
        outcome.errors.append(f"producer: {producer['error']}")
    if producer.get("rejected") or producer.get("released"):
        outcome.errors.append(f"producer: {producer['rejected']} rejected, {producer['released']} released")
    latencies, last_accept_ns, client_cpu_s = [], 0, producer.get("cpu_s", 0.0)
    events: dict[str, list] = {}
    owners: dict[str, set] = {}
    first_ns: dict[str, int] = {}  # group -> its first receipt, and who had it: where placement put it
    first_holder: dict[str, int] = {}
    seen: set = set()
    for index, record in enumerate(consumers):
        if record is None:
            outcome.errors.append(f"consumer {index} wrote no result")
            continue
        if record["error"]:
            outcome.errors.append(f"consumer {index}: {record['error']}")
        outcome.per_consumer.append(record["count"])
        outcome.received += record["count"]
        client_cpu_s += record["cpu_s"]
        last_accept_ns = max(last_accept_ns, record["last_accept_ns"])
        latencies.extend(record["latencies_ns"])
        for group, seq, received_ns in zip(record["groups"], record["seqs"], record["received_ns"]):
            events.setdefault(group, []).append((received_ns, seq))
            owners.setdefault(group, set()).add(index)
            if received_ns < first_ns.get(group, received_ns + 1):
                first_ns[group], first_holder[group] = received_ns, index
            seen.add((group, seq))
    outcome.unique = len(seen)
    outcome.duplicates = outcome.received - outcome.unique
    outcome.lost = workload.messages - outcome.unique
    # A violation: a message received (by any consumer) after a later message of its group.
    for group_events in events.values():
        group_events.sort()
        highest = -1
        for _, seq in group_events:
            if seq < highest:
                outcome.order_violations += 1
            else:
                highest = seq
    outcome.groups_seen = len(owners)
    outcome.groups_per_consumer = [0] * len(consumers)
    for holder in first_holder.values():
        outcome.groups_per_consumer[holder] += 1
    outcome.groups_split = sum(1 for consumers_of_group in owners.values() if len(consumers_of_group) > 1)
    latencies.sort()
    outcome.latency_p50_ms = _percentile(latencies, 0.50) / 1e6
    outcome.latency_p99_ms = _percentile(latencies, 0.99) / 1e6
    if producer.get("first_send_ns") and producer.get("last_send_ns"):
        outcome.producer_send_s = (producer["last_send_ns"] - producer["first_send_ns"]) / 1e9
    elapsed_s = (last_accept_ns - producer.get("first_send_ns", 0)) / 1e9
    if outcome.unique and producer.get("first_send_ns") and elapsed_s > 0:
        outcome.throughput_per_s = outcome.unique / elapsed_s
    if outcome.unique:
        outcome.broker_cpu_us_per_msg = broker_cpu_s / outcome.unique * 1e6
        outcome.client_cpu_us_per_msg = client_cpu_s / outcome.unique * 1e6
