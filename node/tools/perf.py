"""`grouper perf`: a load generator that measures the broker, not itself, and checks what it got back.

Rules:
- Messages move on the lean engine client (node/tools/lean.py: proton's C engine, no reactor): all
  producers and consumers share one selectors loop in this process, one connection each, spread over
  the --node list round-robin (producer i and consumer i on node i mod N).
- Each group belongs to one producer (group g to producer g mod P), which numbers its messages from 0
  (lean's SEQ_KEY) and stamps its send time (SENT_KEY, CLOCK_MONOTONIC: this process reads both ends).
  A producer keeps at most WINDOW_MESSAGES unsettled and, with --rate, its share of the rate.
- A consumer grants --prefetch credit, accepts each delivery as it is read and grants the credit back
  after each pass, so at most --prefetch deliveries are unsettled on its link.
- `Ledger` is the check, pure: per group, a message seen twice is a duplicate, one arriving after a
  later one of its group an order violation; lost = accepted by the node - distinct received, after the
  consumers stayed DRAIN_STALL_S without a new message.
- On a terminal a progress line is redrawn every PROGRESS_INTERVAL_S; elsewhere only the report.
  Exit status: 0 with nothing lost, duplicated or out of order and no refusals; 1 otherwise; 2 bad flags.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass

from node.core.errors import InvalidConfig
# proton's C engine (node.amqp.engine, node.tools.lean) is imported where a run needs it: `grouper` builds its
# parser with this module, and its other commands should not load the library
from node.tools.messages import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from node.tools.session import AMQP_NODE_DEFAULT, AMQP_NODE_ENV, node_url

WINDOW_MESSAGES = 1000  # unsettled sends a producer allows itself, whatever credit the node grants
DRAIN_STALL_S = 10.0  # once sending is over, consumers this long without a message end the run
ATTACH_TIMEOUT_S = 30.0  # every link attached
PROGRESS_INTERVAL_S = 0.5
SELECT_TIMEOUT_S = 0.05  # longest sleep of the loop: how often deadlines are looked at
MESSAGES_DEFAULT = 10_000  # without --messages and --duration-s
CONNECTIONS_MAX = 1000  # producers + consumers
PERCENTILES = (50, 90, 99, 99.9)


@dataclass(frozen=True)
class PerfPlan:
    queue: str
    nodes: tuple  # AMQP URLs
    producers: int
    consumers: int
    groups: int
    prefetch: int
    durable: bool
    rate_per_s: int  # all producers together; 0: as fast as credit and window allow
    duration_s: float  # 0: until `messages`
    messages: int  # 0: until `duration_s`
    body_bytes: int

    def check(self) -> "PerfPlan":
        for key in ("producers", "consumers", "groups", "prefetch"):
            if getattr(self, key) < 1:
                raise InvalidConfig(f"--{key}", f"must be >= 1, got {getattr(self, key)}")
        if self.producers + self.consumers > CONNECTIONS_MAX:
            raise InvalidConfig("--producers", f"producers + consumers is at most {CONNECTIONS_MAX} (one connection "
                                               f"each)")
        if self.groups < self.producers:
            raise InvalidConfig("--groups", f"each producer owns its groups: give at least --producers "
                                            f"({self.producers}) groups, got {self.groups}")
        for key in ("rate_per_s", "duration_s", "messages", "body_bytes"):
            if getattr(self, key) < 0:
                raise InvalidConfig(f"--{key.replace('_per_s', '').replace('_', '-')}", "must not be negative")
        return self


class Ledger:
    """What the consumers got, per group: duplicates and order violations as they arrive."""

    def __init__(self):
        self._seen: dict[str, bytearray] = {}  # group -> one byte per seq
        self._highest: dict[str, int] = {}
        self.received = self.distinct = self.duplicates = self.order_violations = 0

    def record(self, group: str, seq: int) -> None:
        self.received += 1
        seen = self._seen.get(group)
        if seen is None:
            seen = self._seen[group] = bytearray()
        if seq >= len(seen):
            seen.extend(bytes(seq + 1 - len(seen) + len(seen) // 2))  # amortized growth
        if seen[seq]:
            self.duplicates += 1
            return
        seen[seq] = 1
        self.distinct += 1
        highest = self._highest.get(group, -1)
        if seq < highest:
            self.order_violations += 1
        else:
            self._highest[group] = seq

    def lost(self, accepted: int) -> int:
        return max(0, accepted - self.distinct)


def percentile(sorted_values: list, fraction: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(fraction * len(sorted_values)))]


# ---- flags -----------------------------------------------------------------------------------

def register(subparsers) -> None:
    from node.tools.messages import connection_flags

    parser = subparsers.add_parser("perf", parents=[connection_flags()], help="load generator: throughput, "
                                   "latency, per-group order", description="Send grouped messages through "
                                   "one or more nodes and consume them, then report throughput, latency "
                                   "percentiles, lost and duplicated messages and per-group order violations.")
    parser.add_argument("--queue", default="perf", help="queue to load (default perf)")
    parser.add_argument("--nodes", metavar="URL,...", help="AMQP addresses to spread producers and consumers "
                                                           "over (default --node, or the one default node)")
    parser.add_argument("--producers", type=int, default=1, metavar="N", help="connections sending (default 1)")
    parser.add_argument("--consumers", type=int, default=4, metavar="N", help="connections consuming (default 4)")
    parser.add_argument("--groups", type=int, default=100, metavar="N", help="distinct groups (default 100)")
    parser.add_argument("--prefetch", type=int, default=100, metavar="N", help="credit per consumer (default 100)")
    parser.add_argument("--durable", action="store_true", help="send durable messages")
    parser.add_argument("--rate", type=int, default=0, metavar="MSGS_PER_S",
                        help="messages per second over all producers (default 0: as fast as possible)")
    parser.add_argument("--duration-s", type=float, default=0.0, metavar="S", help="stop sending after S seconds")
    parser.add_argument("--messages", type=int, default=0, metavar="N",
                        help=f"messages in all (default {MESSAGES_DEFAULT} unless --duration-s is given)")
    parser.add_argument("--body-bytes", type=int, default=100, metavar="BYTES", help="body size (default 100)")
    parser.set_defaults(run=run)


def plan_from_args(args: argparse.Namespace) -> PerfPlan:
    given = args.nodes or args.node or os.environ.get(AMQP_NODE_ENV) or AMQP_NODE_DEFAULT
    nodes = []
    for text in given.split(","):
        scheme, host, port = node_url(text.strip())
        nodes.append(f"{scheme}://{host}:{port}")
    messages = args.messages or (0 if args.duration_s else MESSAGES_DEFAULT)
    return PerfPlan(queue=args.queue, nodes=tuple(nodes), producers=args.producers, consumers=args.consumers,
                    groups=args.groups, prefetch=args.prefetch, durable=args.durable, rate_per_s=args.rate,
                    duration_s=args.duration_s, messages=messages, body_bytes=args.body_bytes).check()


def run(args: argparse.Namespace) -> int:
    from node.tools.lean import LeanError

    try:
        plan = plan_from_args(args)
        target_options = _target_options(args, plan)
    except InvalidConfig as error:
        print(f"grouper perf: bad input: {error}", file=sys.stderr)
        return EXIT_USAGE
    interactive = sys.stdout.isatty()
    try:
        outcome = Run(plan, target_options).execute(interactive)
    except (LeanError, OSError) as error:
        print(f"grouper perf: {error}", file=sys.stderr)
        return EXIT_FAILED
    print(outcome.report(plan), flush=True)
    return EXIT_OK if outcome.clean else EXIT_FAILED


def _target_options(args: argparse.Namespace, plan: PerfPlan) -> dict:
    from node.tools.session import CA_ENV, USER_ENV, password_for

    ca = args.ca or os.environ.get(CA_ENV, "")
    user = args.user or os.environ.get(USER_ENV, "")
    options = {"tls": bool(ca) or plan.nodes[0].startswith("amqps:"), "ca_file": ca, "user": user, "password": ""}
    if user:
        options["password"] = password_for(user, args, plan.nodes[0])
    return options


# ---- the run ---------------------------------------------------------------------------------

@dataclass
class _Target:
    """What node.tools.lean.Endpoint reads from a target."""
    url: str
    tls: bool
    ca_file: str
    user: str
    password: str
    sasl_mechs: str = ""


class _Producer:
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


class _Consumer:
    def __init__(self, index: int, link):
        self.index, self.link = index, link
        self.accepted_since_flow = 0
        self.received = 0
        self.opened = False
        self.error = ""


@dataclass
class Outcome:
    sent: int
    accepted: int
    refused: int
    ledger: Ledger
    latencies_ns: list
    send_s: float
    receive_s: float
    errors: list

    @property
    def lost(self) -> int:
        return self.ledger.lost(self.accepted)

    @property
    def clean(self) -> bool:
        return not (self.lost or self.ledger.duplicates or self.ledger.order_violations or self.refused
                    or self.errors)

    def report(self, plan: PerfPlan) -> str:
        ledger = self.ledger
        latencies = sorted(self.latencies_ns)
        throughput = ledger.received / self.receive_s if self.receive_s > 0 else 0.0
        lines = [
            f"queue {plan.queue} on {', '.join(plan.nodes)}: {plan.producers} producer(s), {plan.consumers} "
            f"consumer(s), {plan.groups} groups, prefetch {plan.prefetch}, "
            f"{'durable' if plan.durable else 'not durable'}"
            + (f", rate {plan.rate_per_s}/s" if plan.rate_per_s else ""),
            f"sent {self.sent}, accepted {self.accepted}, refused {self.refused} in {self.send_s:.2f} s",
            f"received {ledger.received} in {self.receive_s:.2f} s: {throughput:,.0f} msgs/s",
            "latency ms (send to receive): " + "  ".join(
                f"p{p:g} {percentile(latencies, p / 100) / 1e6:.2f}" for p in PERCENTILES)
            + f"  max {(latencies[-1] if latencies else 0) / 1e6:.2f}",
            f"lost {self.lost}, duplicates {ledger.duplicates}, order violations {ledger.order_violations}",
        ]
        lines += [f"error: {error}" for error in self.errors]
        return "\n".join(lines)


class Run:
    """One load run on one selectors loop: attach every link, send, drain, count."""

    def __init__(self, plan: PerfPlan, target_options: dict):
        from node.tools.lean import MessageEncoder, Pump

        self.plan = plan
        self.pump = Pump(self._on_event)
        self.encoder = MessageEncoder(plan.body_bytes, plan.durable, group_as_subject=False)
        self.ledger = Ledger()
        self.latencies_ns: list = []
        self.producers: list[_Producer] = []
        self.consumers: list[_Consumer] = []
        self.by_link: dict = {}
        self.errors: list[str] = []
        self.targets = [_Target(url, **target_options) for url in plan.nodes]
        self._receive_bytes = 64 << 10
        from node.amqp.engine import ffi

        self._buffer = ffi.new("char[]", self._receive_bytes)

    def _endpoint(self, index: int, container_id: str):
        from node.tools.lean import LeanError

        target = self.targets[index % len(self.targets)]
        try:
            return self.pump.connect(target, container_id)
        except OSError as error:
            raise LeanError(f"no node listening at {target.url} ({error.strerror or error}): start one with "
                            f"`grouper up`, or give the nodes' AMQP addresses with --nodes") from None

    def _connect(self) -> None:
        from node.amqp.engine import lib

        plan = self.plan
        names = [f"perf-g{index:05d}" for index in range(plan.groups)]
        for index in range(plan.consumers):
            endpoint = self._endpoint(index, f"perf-consumer-{index}")
            link = endpoint.receiver(f"perf-consumer-{index}", plan.queue)
            lib.pn_link_flow(link, plan.prefetch)
            consumer = _Consumer(index, link)
            self.consumers.append(consumer)
            self.by_link[link] = consumer
        quotas = [plan.messages // plan.producers + (index < plan.messages % plan.producers)
                  for index in range(plan.producers)]
        for index in range(plan.producers):
            endpoint = self._endpoint(index, f"perf-producer-{index}")
            link = endpoint.sender(f"perf-producer-{index}", plan.queue)
            producer = _Producer(index, link, names[index::plan.producers], quotas[index],
                                 plan.rate_per_s / plan.producers)
            producer.done = plan.messages > 0 and quotas[index] == 0
            self.producers.append(producer)
            self.by_link[link] = producer

    def _on_event(self, kind: int, event) -> None:
        from node.amqp.engine import (CONNECTION_REMOTE_CLOSE, DELIVERY, LINK_REMOTE_CLOSE, LINK_REMOTE_DETACH,
                                      LINK_REMOTE_OPEN, TRANSPORT_ERROR, lib, terminus_present)
        from node.tools.lean import _problem

        if kind == DELIVERY:
            delivery = lib.pn_event_delivery(event)
            state = self.by_link.get(lib.pn_delivery_link(delivery))
            if isinstance(state, _Consumer):
                self._receive(state, delivery)
            elif state is not None and lib.pn_delivery_updated(delivery):
                self._outcome(state, delivery)
        elif kind == LINK_REMOTE_OPEN:
            link = lib.pn_event_link(event)
            state = self.by_link.get(link)
            # a refused link's attach has a null terminus, then a detach names why
            if isinstance(state, _Consumer):
                state.opened = terminus_present(lib.pn_link_remote_source(link))
            elif state is not None:
                state.opened = terminus_present(lib.pn_link_remote_target(link))
        elif kind in (LINK_REMOTE_CLOSE, LINK_REMOTE_DETACH):
            state = self.by_link.get(lib.pn_event_link(event))
            if state is not None and not state.error:
                state.error = _problem(kind, event) or "link detached by the node"
                self.errors.append(state.error)
        elif kind in (CONNECTION_REMOTE_CLOSE, TRANSPORT_ERROR):
            problem = _problem(kind, event)
            if problem and problem not in self.errors:
                self.errors.append(problem)

    def _outcome(self, producer: _Producer, delivery) -> None:
        from node.amqp.engine import ACCEPTED, MODIFIED, REJECTED, RELEASED, lib

        state = lib.pn_delivery_remote_state(delivery)
        if state == ACCEPTED:
            producer.accepted += 1
        elif state in (REJECTED, RELEASED, MODIFIED):
            producer.refused += 1
        else:
            return  # not an outcome yet
        lib.pn_delivery_settle(delivery)

    def _receive(self, consumer: _Consumer, delivery) -> None:
        from node.amqp.engine import ACCEPTED, ffi, lib
        from node.tools.lean import read_fields

        if not lib.pn_delivery_readable(delivery) or lib.pn_delivery_partial(delivery):
            return  # an update of a delivery already read, or more frames to come
        link = consumer.link
        size = lib.pn_delivery_pending(delivery)
        if size > self._receive_bytes:
            self._receive_bytes = max(size, 2 * self._receive_bytes)
            self._buffer = ffi.new("char[]", self._receive_bytes)
        count = lib.pn_link_recv(link, self._buffer, size)
        payload = ffi.unpack(self._buffer, max(count, 0))
        lib.pn_link_advance(link)
        lib.pn_delivery_update(delivery, ACCEPTED)
        lib.pn_delivery_settle(delivery)
        group, seq, sent_ns = read_fields(payload)
        consumer.received += 1
        consumer.accepted_since_flow += 1
        if group is None or seq < 0:
            self.errors.append(f"a message without a group or {seq!r} sequence reached consumer {consumer.index}: "
                               f"is another producer sending to {self.plan.queue}?")
            return
        self.ledger.record(group, seq)
        self.latencies_ns.append(time.monotonic_ns() - sent_ns)

    def _send_due(self, producer: _Producer, start_ns: int, now_ns: int, sending_over: bool) -> None:
        from node.amqp.engine import delivery_tag, lib

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

    def _top_up(self) -> None:
        from node.amqp.engine import lib

        for consumer in self.consumers:
            if consumer.accepted_since_flow:
                lib.pn_link_flow(consumer.link, consumer.accepted_since_flow)
                consumer.accepted_since_flow = 0

    def _pass(self) -> None:
        self.pump.flush()
        self.pump.run_once(SELECT_TIMEOUT_S)
        self._top_up()

    def _attach(self) -> None:
        from node.tools.lean import LeanError

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
        plan = self.plan
        try:
            self._connect()
            self._attach()
            start_ns = time.monotonic_ns()
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
                if not sending and (self.ledger.distinct >= accepted
                                    or now_ns - last_receive_ns > DRAIN_STALL_S * 1e9):
                    break
                if all(endpoint.closed for endpoint in self.pump.endpoints):
                    self.errors.append("every connection closed")
                    break
            if interactive:
                print("\r\033[K", end="", flush=True)
        finally:
            self.pump.close_all()
        return Outcome(sent=sum(p.sent for p in self.producers), accepted=sum(p.accepted for p in self.producers),
                       refused=sum(p.refused for p in self.producers), ledger=self.ledger,
                       latencies_ns=self.latencies_ns, send_s=(send_end_ns - start_ns) / 1e9,
                       receive_s=(max(last_receive_ns, send_end_ns) - start_ns) / 1e9, errors=self.errors)

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
