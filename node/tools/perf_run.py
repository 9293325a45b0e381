"""One `grouper perf` run: every producer and consumer on one pump, sent, drained and counted.

Rules:
- Messages move on the lean engine client (node/client: proton's C engine, no reactor): all
  producers and consumers share one selectors loop in this process, one connection each, spread over
  the --node list round-robin (producer i and consumer i on node i mod N).
- Each group belongs to one producer (group g to producer g mod P), which numbers its messages from 0
  (SEQ_KEY) and stamps its send time (SENT_KEY, CLOCK_MONOTONIC: this process reads both ends).
  A producer keeps at most WINDOW_MESSAGES unsettled and, with --rate, its share of the rate.
- A consumer grants --prefetch credit, accepts each delivery as it is read and grants the credit back
  after each pass (node/client/traffic.py), so at most --prefetch deliveries are unsettled on its link.
- The run ends once sending is over and every accepted message arrived, or the consumers stayed
  DRAIN_STALL_S without a new message; node/tools/perf_ledger.py judges what arrived.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from node.amqp.engine import ACCEPTED, MODIFIED, REJECTED, RELEASED, delivery_tag, lib
from node.client.encoding import MessageEncoder, read_fields
from node.client.endpoint import LeanError
from node.client.pump import SELECT_TIMEOUT_S
from node.client.traffic import WINDOW_MESSAGES, Traffic
from node.tools.perf_ledger import Ledger, Outcome

DRAIN_STALL_S = 10.0  # once sending is over, consumers this long without a message end the run
ATTACH_TIMEOUT_S = 30.0  # every link attached
PROGRESS_INTERVAL_S = 0.5


@dataclass
class _Target:
    """What node.client.endpoint.connect reads from a target."""
    url: str
    tls: bool
    ca_file: str
    user: str
    password: str
    sasl_mechs: str = ""


class _Sender:
    def __init__(self, index: int, link, groups: list, quota: int, rate_per_s: float):
        self.index, self.link, self.groups = index, link, groups
        self.quota = quota  # messages to send (0: until the duration ends)
        self.rate_per_s = rate_per_s
        self.next_seq = [0] * len(groups)
        self.turn = 0
        self.sent = self.accepted = self.refused = 0
        self.opened = False
        self.error = ""
        self.done = False  # sends nothing more

    @property
    def unsettled(self) -> int:
        return self.sent - self.accepted - self.refused


class _Receiver:
    def __init__(self, index: int, link):
        self.index, self.link = index, link
        self.accepted_since_flow = 0
        self.received = 0
        self.opened = False
        self.error = ""


class Run:
    """One load run on one selectors loop: attach every link, send, drain, count."""

    def __init__(self, plan, target_options: dict):
        self.plan = plan
        self.traffic = Traffic(self._message, self._outcome, self._failed)
        self.pump = self.traffic.pump
        self.encoder = MessageEncoder(plan.body_bytes, plan.durable, group_as_subject=False)
        self.ledger = Ledger()
        self.latencies_ns: list = []
        self.producers: list[_Sender] = []
        self.consumers: list[_Receiver] = []
        self.errors: list[str] = []
        self.targets = [_Target(url, **target_options) for url in plan.nodes]

    def _endpoint(self, index: int, container_id: str):
        target = self.targets[index % len(self.targets)]
        try:
            return self.pump.connect(target, container_id)
        except OSError as error:
            raise LeanError(f"no node listening at {target.url} ({error.strerror or error}): start one with "
                            f"`grouper up`, or give the nodes' AMQP addresses with --nodes") from None

    def _connect(self) -> None:
        plan = self.plan
        names = [f"perf-g{index:05d}" for index in range(plan.groups)]
        for index in range(plan.consumers):
            endpoint = self._endpoint(index, f"perf-consumer-{index}")
            consumer = _Receiver(index, endpoint.receiver(f"perf-consumer-{index}", plan.queue))
            self.consumers.append(consumer)
            self.traffic.add_consumer(consumer, plan.prefetch)
        quotas = [plan.messages // plan.producers + (index < plan.messages % plan.producers)
                  for index in range(plan.producers)]
        for index in range(plan.producers):
            endpoint = self._endpoint(index, f"perf-producer-{index}")
            link = endpoint.sender(f"perf-producer-{index}", plan.queue)
            producer = _Sender(index, link, names[index::plan.producers], quotas[index],
                                 plan.rate_per_s / plan.producers)
            producer.done = plan.messages > 0 and quotas[index] == 0
            self.producers.append(producer)
            self.traffic.add_producer(producer)

    def _failed(self, state, problem: str) -> None:
        if state is None:
            if problem and problem not in self.errors:
                self.errors.append(problem)
        elif not state.error:
            state.error = problem or "link detached by the node"
            self.errors.append(state.error)

    def _outcome(self, producer: _Sender, delivery) -> None:
        state = lib.pn_delivery_remote_state(delivery)
        if state == ACCEPTED:
            producer.accepted += 1
        elif state in (REJECTED, RELEASED, MODIFIED):
            producer.refused += 1
        else:
            return  # not an outcome yet
        lib.pn_delivery_settle(delivery)

    def _message(self, consumer: _Receiver, payload: bytes) -> None:
        group, seq, sent_ns = read_fields(payload)
        consumer.received += 1
        if group is None or seq < 0:
            self.errors.append(f"a message without a group or {seq!r} sequence reached consumer {consumer.index}: "
                               f"is another producer sending to {self.plan.queue}?")
            return
        self.ledger.record(group, seq)
        self.latencies_ns.append(time.monotonic_ns() - sent_ns)

    def _send_due(self, producer: _Sender, start_ns: int, now_ns: int, sending_over: bool) -> None:
        if producer.done or producer.error:
            return
        if sending_over or (producer.quota and producer.sent >= producer.quota):
            producer.done = True
            return
        count = min(lib.pn_link_credit(producer.link), WINDOW_MESSAGES - producer.unsettled)
        if producer.quota:
            count = min(count, producer.quota - producer.sent)
        if producer.rate_per_s:
            due = int((now_ns - start_ns) * producer.rate_per_s / 1e9) + 1
            count = min(count, due - producer.sent)
        link, groups, encode = producer.link, producer.groups, self.encoder.encode
        for _ in range(max(0, count)):
            turn = producer.turn
            producer.turn = (turn + 1) % len(groups)
            seq = producer.next_seq[turn]
            producer.next_seq[turn] = seq + 1
            payload = encode(groups[turn], time.monotonic_ns(), seq)
            lib.pn_delivery(link, delivery_tag(producer.sent))
            lib.pn_link_send(link, payload, len(payload))
            lib.pn_link_advance(link)
            producer.sent += 1

    def _pass(self) -> None:
        self.traffic.pass_once(SELECT_TIMEOUT_S)

    def _attach(self) -> None:
        deadline = time.monotonic() + ATTACH_TIMEOUT_S
        links = self.producers + self.consumers
        while not all(state.opened for state in links):
            if self.errors:
                raise LeanError(f"the node refused a link on {self.plan.queue!r}: {self.errors[0]}")
            if time.monotonic() > deadline:
                waiting = sum(not state.opened for state in links)
                raise LeanError(f"{waiting} link(s) not attached within {ATTACH_TIMEOUT_S:g} s")
            closed = [endpoint.error for endpoint in self.pump.endpoints if endpoint.closed]
            if closed:
                raise LeanError(f"a connection closed during attach: {closed[0] or 'by the node'}")
            self._pass()

    def execute(self, interactive: bool) -> Outcome:
        try:
            self._connect()
            self._attach()
            start_ns = time.monotonic_ns()
            send_end_ns, last_receive_ns = self._move(start_ns, interactive)
            if interactive:
                print("\r\033[K", end="", flush=True)
        finally:
            self.pump.close_all()
        return Outcome(sent=sum(p.sent for p in self.producers), accepted=sum(p.accepted for p in self.producers),
                       refused=sum(p.refused for p in self.producers), ledger=self.ledger,
                       latencies_ns=self.latencies_ns, send_s=(send_end_ns - start_ns) / 1e9,
                       receive_s=(max(last_receive_ns, send_end_ns) - start_ns) / 1e9, errors=self.errors)

    def _move(self, start_ns: int, interactive: bool) -> tuple[int, int]:
        """Send and receive until the run is over: (when sending ended, when the last message came), ns."""
        plan = self.plan
        send_end_ns = last_receive_ns = start_ns
        next_progress_s = 0.0
        while True:
            now_ns = time.monotonic_ns()
            sending_over = bool(plan.duration_s) and now_ns - start_ns >= plan.duration_s * 1e9
            for producer in self.producers:
                self._send_due(producer, start_ns, now_ns, sending_over)
            received_before = self.ledger.received
            self._pass()
            now_ns = time.monotonic_ns()
            if self.ledger.received != received_before:
                last_receive_ns = now_ns
            sending = not all(producer.done and not producer.unsettled or producer.error
                              for producer in self.producers)
            if sending:
                send_end_ns = now_ns
                last_receive_ns = max(last_receive_ns, now_ns)
            accepted = sum(producer.accepted for producer in self.producers)
            if interactive and now_ns / 1e9 >= next_progress_s:
                next_progress_s = now_ns / 1e9 + PROGRESS_INTERVAL_S
                self._progress(start_ns, now_ns)
            if not sending and (self.ledger.distinct >= accepted or now_ns - last_receive_ns > DRAIN_STALL_S * 1e9):
                return send_end_ns, last_receive_ns
            if all(endpoint.closed for endpoint in self.pump.endpoints):
                self.errors.append("every connection closed")
                return send_end_ns, last_receive_ns

    def _progress(self, start_ns: int, now_ns: int) -> None:
        elapsed_s = (now_ns - start_ns) / 1e9
        sent = sum(producer.sent for producer in self.producers)
        plan, received = self.plan, self.ledger.received
        if plan.messages:
            left = f"{received}/{plan.messages} received"
            rate = received / elapsed_s if elapsed_s > 0 else 0.0
            eta = f", ~{(plan.messages - received) / rate:.0f} s left" if rate > 0 else ""
        else:
            left = f"{received} received"
            eta = f", {max(0.0, plan.duration_s - elapsed_s):.0f} s of sending left"
        rate_now = received / elapsed_s if elapsed_s > 0 else 0.0
        print(f"\r\033[K{elapsed_s:6.1f} s  sent {sent}  {left}  {rate_now:,.0f} msgs/s{eta}", end="", flush=True)
