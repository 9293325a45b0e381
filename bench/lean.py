"""The benchmark's AMQP 1.0 load generator: producer and consumer processes on the lean engine client.

The client (connections, the selectors pump, link traffic, message templates and the field reader) is
the package `node.client`, shared with `grouper perf` and the pipeline; its rules are in its modules'
headers and the names bench code and tests reach as `lean.NAME` are re-exported here. Here:
- The benchmark's producer and consumer processes: a consumer grants `prefetch` credit at attach and,
  after each pass, as much credit as it accepted, so at most `prefetch` deliveries are ever unsettled
  (node/client/traffic.py).
- It moves messages and writes what it saw, in the form clients.py summarises; it never starts
  brokers and never formats tables.
- `python -m bench.lean --url ... --queue ...` runs one row against any AMQP 1.0 broker and prints
  what clients.py measured (no broker CPU: the broker may be elsewhere); bench/lean_row.py reads its
  flags.
"""

from __future__ import annotations

import sys
import time
from array import array

from bench import clients
from bench.lean_row import main, parser, read_password_file, target_from_args
from node.amqp.engine import ACCEPTED, MODIFIED, REJECTED, RELEASED, condition_text, delivery_tag, lib, tag_value
from node.client.encoding import MessageEncoder, read_fields
from node.client.endpoint import Endpoint, LeanError, connect, credentials, tls_context
from node.client.pump import SELECT_TIMEOUT_S, Pump
from node.client.traffic import WINDOW_MESSAGES, Traffic
from node.net import is_loopback

# the client's names other bench modules and tests reach as lean.NAME
__all__ = ["Endpoint", "LeanError", "MessageEncoder", "Pump", "connect", "credentials", "is_loopback", "read_fields",
           "tls_context", "Producer", "Consumers", "producer", "consumers", "parser", "read_password_file",
           "target_from_args", "main", "SELECT_TIMEOUT_S"]

# ---- the producer -----------------------------------------------------------------------------

class Producer:
    """Sends the workload's plan on one link, at most `window_messages` unsettled, counting outcomes."""

    def __init__(self, target, workload, window_messages: int = WINDOW_MESSAGES):
        self.groups, self.seqs = clients.plan(workload)
        self.total = workload.messages
        self.rate_per_s = workload.rate_per_s
        self.window_messages = window_messages
        self.encoder = MessageEncoder(workload.body_bytes, workload.durable, target.routing_subject)
        self.traffic = Traffic(None, self._outcome, self._failed)
        self.pump = self.traffic.pump
        self.endpoint = self.pump.connect(target, "bench-producer")
        self.link = self.endpoint.sender("bench-producer", target.send_address)
        self.opened = False
        self.sent = self.accepted = self.rejected = self.released = self.modified = 0
        self.first_send_ns = self.last_send_ns = 0
        self.outcome_seen = bytearray(self.total)
        self.error = ""
        self.traffic.add_producer(self)

    @property
    def settled(self) -> int:
        return self.accepted + self.rejected + self.released + self.modified

    def _failed(self, state, problem: str) -> None:
        self.error = self.error or problem

    def _outcome(self, producer, delivery) -> None:
        # A delivery's second event (RabbitMQ sends the outcome, then the settlement) can wait in the
        # collector after the first has settled it: each tag (the send's number) counts once.
        number = int(tag_value(delivery))
        if self.outcome_seen[number]:
            return
        state = lib.pn_delivery_remote_state(delivery)
        if state == ACCEPTED:
            self.accepted += 1
        elif state == REJECTED:
            self.rejected += 1
            if not self.error:
                self.error = "rejected: " + condition_text(lib.pn_disposition_condition(lib.pn_delivery_remote(delivery)))
        elif state == RELEASED:
            self.released += 1
        elif state == MODIFIED:
            self.modified += 1
        else:
            return  # not an outcome yet
        self.outcome_seen[number] = 1
        lib.pn_delivery_settle(delivery)

    def wait_attached(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.opened and not self.error and not self.endpoint.closed:
            if time.monotonic() > deadline:
                raise LeanError(f"the producer link was not attached within {timeout_s} s")
            self.pump.flush()
            self.pump.run_once(SELECT_TIMEOUT_S)
        if self.error or self.endpoint.closed:
            raise LeanError(self.error or self.endpoint.error or "the connection closed during attach")

    def run(self, stall_timeout_s: float) -> None:
        """Send everything and wait for every outcome; stops early on an error or a stall."""
        start_ns = time.monotonic_ns()
        last_progress_ns, last_settled = start_ns, -1
        while (self.sent < self.total or self.settled < self.sent) and not self.error and not self.endpoint.closed:
            self._send_due(start_ns)
            self.pump.flush()
            self.pump.run_once(self._sleep_s(start_ns))
            now_ns = time.monotonic_ns()
            if self.settled != last_settled:
                last_settled, last_progress_ns = self.settled, now_ns
            elif now_ns - last_progress_ns > stall_timeout_s * 1e9:
                self.error = f"no outcome for {stall_timeout_s} s ({self.settled}/{self.sent} settled)"
        self.error = self.error or self.endpoint.error

    def _send_due(self, start_ns: int) -> None:
        link = self.link
        count = min(lib.pn_link_credit(link), self.window_messages - (self.sent - self.settled), self.total - self.sent)
        if self.rate_per_s:
            due = (time.monotonic_ns() - start_ns) * self.rate_per_s // 1_000_000_000 + 1
            count = min(count, due - self.sent)
        if count <= 0:
            return
        groups, seqs, encode = self.groups, self.seqs, self.encoder.encode
        send, advance, new_delivery, monotonic_ns = lib.pn_link_send, lib.pn_link_advance, lib.pn_delivery, time.monotonic_ns
        number = self.sent
        if not number:
            self.first_send_ns = monotonic_ns()
        for number in range(number, number + count):
            payload = encode(groups[number], monotonic_ns(), seqs[number])
            new_delivery(link, delivery_tag(number))
            send(link, payload, len(payload))
            advance(link)
        self.sent = number + 1
        self.last_send_ns = monotonic_ns()

    def _sleep_s(self, start_ns: int) -> float:
        if not self.rate_per_s or self.sent >= self.total:
            return SELECT_TIMEOUT_S
        next_due_ns = start_ns + self.sent * 1_000_000_000 // self.rate_per_s
        return min(SELECT_TIMEOUT_S, max(0.0, (next_due_ns - time.monotonic_ns()) / 1e9))

    def result(self) -> dict:
        return {"sent": self.sent, "accepted": self.accepted, "rejected": self.rejected,
                "released": self.released + self.modified, "first_send_ns": self.first_send_ns,
                "last_send_ns": self.last_send_ns, "error": self.error}


def producer(target, workload, go, result_path: str) -> None:
    """The producer process: attach, wait for `go`, send the plan, write what happened."""
    result = {"sent": 0, "accepted": 0, "rejected": 0, "released": 0, "first_send_ns": 0, "last_send_ns": 0,
              "cpu_s": 0.0, "error": ""}
    cpu_start_s = clients._cpu_s()
    sender = None
    try:
        sender = Producer(target, workload)
        sender.wait_attached(clients.READY_TIMEOUT_S)
        go.wait()
        cpu_start_s = clients._cpu_s()
        sender.run(clients.STALL_TIMEOUT_S)
        result.update(sender.result())
    except Exception as error:  # reported in the row, not raised: a benchmark records failures
        result["error"] = f"{type(error).__name__}: {error}"
    result["cpu_s"] = clients._cpu_s() - cpu_start_s
    if sender is not None:
        sender.pump.close_all()
    clients._dump(result_path, result)


# ---- consumers --------------------------------------------------------------------------------

class _Consumer:
    __slots__ = ("index", "link", "opened", "accepted_since_flow", "count", "groups", "seqs", "received_ns",
                 "latencies_ns", "last_accept_ns", "error")

    def __init__(self, index: int, link):
        self.index = index
        self.link = link
        self.opened = False
        self.accepted_since_flow = 0
        self.count = 0
        self.groups: list = []
        self.seqs = array("q")
        self.received_ns = array("q")
        self.latencies_ns = array("q")
        self.last_accept_ns = 0
        self.error = ""

    def as_dict(self, cpu_s: float) -> dict:
        return {"count": self.count, "groups": self.groups, "seqs": self.seqs, "received_ns": self.received_ns,
                "latencies_ns": self.latencies_ns, "last_accept_ns": self.last_accept_ns, "error": self.error,
                "cpu_s": cpu_s}


class Consumers:
    """Consumers in one process, one connection each; every delivery accepted as soon as it is read."""

    def __init__(self, target, indexes: list, prefetch: int):
        self.prefetch = prefetch
        self.traffic = Traffic(self._message, None, self._failed)
        self.pump = self.traffic.pump
        self.consumers: list[_Consumer] = self.traffic.consumers
        for index in indexes:
            endpoint = self.pump.connect(target, f"bench-consumer-{index}")
            for number, address in enumerate(target.consumer_addresses[index]):
                consumer = _Consumer(index, endpoint.receiver(f"bench-c{index}-{number}", address))
                self.traffic.add_consumer(consumer, prefetch)

    def _failed(self, consumer, problem: str) -> None:
        if consumer is not None:
            consumer.error = consumer.error or problem or "link detached by the broker"
        elif problem:
            for each in self.consumers:
                each.error = each.error or problem

    def _message(self, consumer, payload: bytes) -> None:
        received_ns = time.monotonic_ns()
        group, seq, sent_ns = read_fields(payload)
        consumer.count += 1
        consumer.groups.append(group)
        consumer.seqs.append(seq)
        consumer.received_ns.append(received_ns)
        consumer.latencies_ns.append(received_ns - sent_ns)
        consumer.last_accept_ns = received_ns

    def top_up(self) -> None:
        self.traffic.top_up()

    def pass_once(self, timeout_s: float) -> None:
        self.traffic.pass_once(timeout_s)


def consumers(target, indexes: list, workload, readies, stop, progress, result_paths) -> None:
    """The consumer process: attach, signal each ready, consume until `stop`, write what each saw."""
    group = None
    cpu_start_s = clients._cpu_s()
    try:
        group = Consumers(target, indexes, workload.prefetch)
        _attach(group, readies, clients.READY_TIMEOUT_S)
        cpu_start_s = clients._cpu_s()
        next_look_s = 0.0
        while True:
            group.pass_once(SELECT_TIMEOUT_S)
            now_s = time.monotonic()
            if now_s >= next_look_s:  # progress and the stop flag cost a lock each: looked at ~50 times a second
                next_look_s = now_s + 0.02
                for consumer in group.consumers:
                    progress[consumer.index] = consumer.count
                if stop.is_set():
                    break
    except Exception as error:
        if group is None:
            for index in indexes:
                clients._dump(result_paths[index], {**_Consumer(index, None).as_dict(0.0),
                                                    "error": f"{type(error).__name__}: {error}"})
            return
        for consumer in group.consumers:
            consumer.error = consumer.error or f"{type(error).__name__}: {error}"
    cpu_s = clients._cpu_s() - cpu_start_s
    group.pump.close_all()
    # The process's CPU is shared by its consumers; only the sum over all processes is reported.
    for consumer in group.consumers:
        clients._dump(result_paths[consumer.index], consumer.as_dict(cpu_s / len(group.consumers)))


def _attach(group: Consumers, readies, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    waiting = list(group.consumers)
    while waiting:
        if time.monotonic() > deadline:
            raise LeanError(f"{len(waiting)} consumer link(s) not attached within {timeout_s} s")
        group.pass_once(SELECT_TIMEOUT_S)
        failed = [consumer.error for consumer in waiting if consumer.error]
        if failed:
            raise LeanError(failed[0])
        waiting = [consumer for consumer in waiting if not consumer.opened]
    for consumer in group.consumers:
        readies[consumer.index].set()


if __name__ == "__main__":
    sys.exit(main())
