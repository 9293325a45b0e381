"""AMQP clients for the grouping and recovery tests: explicit credit, explicit outcomes, history.

Rules:
- A `Client` is one proton `BlockingConnection`, driven only by the thread that made it. Every
  consumer on it has an explicit link name (proton mixes up unnamed receivers on one address).
- A consumer's credit is exactly what the test grants with `credit=` and `flow()`; nothing tops it
  up behind the test's back, so "prefetch" in a scenario is the credit given here.
- Initial credit is granted before the attach frame leaves, so the node learns the consumer and its
  credit in one batch, as a JMS client with a prefetch would present itself.
- Every wait is bounded. "Nothing arrives" is checked by pumping for a fixed quiet period.
- Test messages carry their group and a per-group sequence number in the body, "group:seq".
"""

from __future__ import annotations

import time
from collections import deque

from proton import Delivery, Endpoint, Link, Message, Timeout
from proton.handlers import MessagingHandler
from proton.reactor import Container, LinkOption
from proton._utils import BlockingLink  # the attach/detach waits of BlockingReceiver, without its Fetcher
from proton.utils import BlockingConnection, BlockingSender

FIRST_KEY = "JMSXGroupFirstForConsumer"
WAIT_S = 10.0  # default bound of every wait for a delivery or a settlement
QUIET_S = 0.5  # how long "nothing arrives" is watched


def group_message(group: str | None, seq: int, *, jms: bool = False, close: str = "", durable: bool = True,
                  **properties) -> Message:
    """A test message; `jms` puts the group id in JMSXGroupID instead of properties.group-id.

    close="jms" adds JMSXGroupSeq = -1; close="amqp" sets group-sequence 0xFFFFFFFF. Durable by default (the
    header's durable true): a durable queue journals only those (issue 29), and these tests mean them kept."""
    application = dict(properties)
    message = Message(body=f"{group}:{seq}", durable=durable)
    if group is not None:
        if jms:
            application["JMSXGroupID"] = group
        else:
            message.group_id = group
    if close == "jms":
        application["JMSXGroupSeq"] = -1
    elif close == "amqp":
        message.group_sequence = 0xFFFFFFFF
    elif close:
        raise ValueError(f"close must be 'jms' or 'amqp', got {close!r}")
    message.properties = application or None
    return message


def queue_toml(name: str, **settings) -> str:
    """One [[queue]] table of a node config file."""
    lines = ["[[queue]]", f"name = {_toml_value(name)}"]
    lines += [f"{key} = {_toml_value(value)}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def parse_body(message: Message) -> tuple[str, int]:
    group, _, seq = str(message.body).rpartition(":")
    return group, int(seq)


class Received:
    """One delivery to a consumer; `broker_settled` turns true when the node settles it (settle-second)."""

    __slots__ = ("consumer", "message", "delivery", "group", "seq", "broker_settled")

    def __init__(self, consumer: "Consumer", message: Message, delivery: Delivery):
        self.consumer = consumer
        self.message = message
        self.delivery = delivery
        self.group, self.seq = parse_body(message)
        self.broker_settled = False

    @property
    def first_for_consumer(self) -> bool:
        return bool((self.message.properties or {}).get(FIRST_KEY, False))

    @property
    def delivery_count(self) -> int:
        return self.message.delivery_count

    def __repr__(self) -> str:
        return f"<{self.consumer.name} {self.group}:{self.seq} dc={self.delivery_count}>"


class _Collector(MessagingHandler):
    def __init__(self, consumer: "Consumer"):
        super().__init__(prefetch=0, auto_accept=False)
        self.consumer = consumer

    def on_message(self, event):
        self.consumer._arrived(event.message, event.delivery)

    def on_settled(self, event):
        self.consumer._broker_settled(event.delivery)


class _InitialCredit(LinkOption):
    def __init__(self, credit: int):
        self.credit = credit

    def apply(self, link) -> None:
        if self.credit:
            link.flow(self.credit)


class _SettleSecond(LinkOption):
    """The consumer will not settle on accepting; it waits for the node to settle first."""

    def apply(self, link) -> None:
        link.rcv_settle_mode = Link.RCV_SECOND


class Consumer:
    def __init__(self, client: "Client", queue: str, name: str, credit: int, settle_second: bool,
                 options: tuple = ()):
        self.client = client
        self.queue = queue
        self.name = name
        self.settle_second = settle_second
        self.history: list[Received] = []  # every delivery, in arrival order
        self.unread: deque[Received] = deque()
        self._by_tag: dict[bytes, Received] = {}
        options = [_InitialCredit(credit)] + ([_SettleSecond()] if settle_second else []) + list(options)
        connection = client.connection
        link = connection.container.create_receiver(connection.conn, queue, name=name,
                                                    handler=_Collector(self), options=options)
        self.link = link
        self._blocking = BlockingLink(connection, link)  # waits for the node's attach

    def _arrived(self, message, delivery) -> None:
        received = Received(self, message, delivery)
        self.history.append(received)
        self.unread.append(received)
        self._by_tag[delivery.tag] = received

    def _broker_settled(self, delivery) -> None:
        received = self._by_tag.get(delivery.tag)
        if received is not None:
            received.broker_settled = True
            delivery.settle()  # settle-second: the node settled first, now this side settles

    # ---- credit and reading ------------------------------------------------------------------

    def flow(self, credit: int) -> None:
        self.link.flow(credit)
        self.client.barrier()

    def take(self, count: int, timeout_s: float = WAIT_S) -> list[Received]:
        """The next `count` deliveries; fails the test if they do not come in time."""
        ok = self.client.wait_for(lambda: len(self.unread) >= count, timeout_s)
        if not ok:
            raise AssertionError(f"{self.name}: expected {count} deliveries within {timeout_s} s, got "
                                 f"{len(self.unread)}: {list(self.unread)}")
        return [self.unread.popleft() for _ in range(count)]

    def take_all(self, quiet_s: float = QUIET_S, timeout_s: float = WAIT_S) -> list[Received]:
        """Whatever arrives until nothing more has arrived for `quiet_s` (or `timeout_s` passed)."""
        deadline = time.monotonic() + timeout_s
        while True:
            before = len(self.unread)
            self.client.settle_down(quiet_s)
            if len(self.unread) == before or time.monotonic() > deadline:
                break
        taken = list(self.unread)
        self.unread.clear()
        return taken

    # ---- outcomes ----------------------------------------------------------------------------

    def accept(self, *received: Received) -> None:
        if not received:
            return
        for item in received:
            item.delivery.update(Delivery.ACCEPTED)
            if not self.settle_second:
                item.delivery.settle()
        self.client.barrier()

    def wait_broker_settled(self, received: list[Received], timeout_s: float = WAIT_S) -> list[Received]:
        """Settle-second: the deliveries the node settled in time; they are then settled here too."""
        self.client.wait_for(lambda: all(r.broker_settled for r in received), timeout_s)
        return [r for r in received if r.broker_settled]

    def close(self) -> None:
        self._blocking.close()


class Producer:
    def __init__(self, client: "Client", queue: str | None, name: str):
        self.client = client
        connection = client.connection
        self.sender = BlockingSender(connection, connection.container.create_sender(
            connection.conn, queue, name=name, handler=None))
        self.link = self.sender.link

    def send(self, *messages: Message, timeout_s: float = WAIT_S) -> None:
        """Send and wait until the node accepted every message; fails the test otherwise."""
        outcomes = self.send_outcomes(list(messages), timeout_s)
        refused = [(parse_body(m), state) for m, state in zip(messages, outcomes) if state != Delivery.ACCEPTED]
        if refused:
            raise AssertionError(f"the node did not accept: {refused}")

    def send_outcomes(self, messages: list[Message], timeout_s: float = WAIT_S) -> list:
        """Send without waiting for each message, then wait for every outcome (None: unsettled)."""
        deliveries = []
        deadline = time.monotonic() + timeout_s
        for message in messages:
            if not self.link.credit:
                self.client.wait_for(lambda: self.link.credit > 0, max(0.0, deadline - time.monotonic()))
            deliveries.append(self.link.send(message))
        self.client.wait_for(lambda: all(d.settled for d in deliveries), max(0.0, deadline - time.monotonic()))
        outcomes = []
        for delivery in deliveries:
            outcomes.append(delivery.remote_state if delivery.settled else None)
            if delivery.settled:
                delivery.settle()
        return outcomes

    def close(self) -> None:
        self.sender.close()


class Client:
    """One AMQP connection to a node, with named consumers and producers."""

    def __init__(self, node, timeout_s: float = WAIT_S, container_id: str = ""):
        """`container_id`: the one the connection opens with (a durable subscription is named from it)."""
        container = Container()
        if container_id:
            container.container_id = container_id
        self.connection = BlockingConnection(node.url, timeout=timeout_s, container=container)
        self._names = 0

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _name(self, prefix: str) -> str:
        self._names += 1
        return f"{prefix}-{self._names}"

    def consumer(self, queue: str, name: str | None = None, credit: int = 0,
                 settle_second: bool = False, options: tuple = ()) -> Consumer:
        """`options`: more proton LinkOptions (the source's capabilities, expiry policy...)."""
        consumer = Consumer(self, queue, name or self._name("consumer"), credit, settle_second, options)
        self.barrier()
        return consumer

    def producer(self, queue: str | None, name: str | None = None) -> Producer:
        return Producer(self, queue, name or self._name("producer"))

    def wait_for(self, condition, timeout_s: float) -> bool:
        try:
            self.connection.wait(condition, timeout=max(timeout_s, 0.001))
        except Timeout:
            return bool(condition())
        return True

    def settle_down(self, quiet_s: float = QUIET_S) -> None:
        """Pump events for `quiet_s`: deliveries that are coming get here."""
        self.wait_for(lambda: False, quiet_s)

    def collect(self, consumers: list[Consumer], count: int, timeout_s: float = WAIT_S,
                quiet_s: float = 0.2) -> list[Received]:
        """Exactly `count` deliveries over `consumers` (in arrival order per consumer); a short
        quiet period afterwards catches any extra delivery, which fails the test."""
        def unread() -> int:
            return sum(len(c.unread) for c in consumers)
        if not self.wait_for(lambda: unread() >= count, timeout_s):
            raise AssertionError(f"expected {count} deliveries within {timeout_s} s, got {unread()}: "
                                 f"{[r for c in consumers for r in c.unread]}")
        self.settle_down(quiet_s)
        received = [r for c in consumers for r in c.unread]
        for consumer in consumers:
            consumer.unread.clear()
        assert len(received) == count, f"expected {count} deliveries, got {len(received)}: {received}"
        return received

    def barrier(self) -> None:
        """A round trip: the node has processed every frame this client sent before it.

        Attaching and detaching an anonymous sender needs the node's answer, and the node reads a
        connection's frames in order, so credit and dispositions sent earlier are in effect."""
        name = self._name("barrier")
        link = self.connection.container.create_sender(self.connection.conn, None, name=name, handler=None)
        self.connection.wait(lambda: not (link.state & Endpoint.REMOTE_UNINIT), msg=f"barrier {name}")
        link.close()
        self.connection.wait(lambda: not (link.state & Endpoint.REMOTE_ACTIVE), msg=f"barrier {name}")

    def close(self) -> None:
        connection = self.connection
        try:
            connection.wait(lambda: connection.disconnected, timeout=0.01)
        except Exception:  # Timeout while connected; ConnectionException once the node is gone
            pass
        if connection.disconnected:
            connection.timeout = 0.1  # a killed node sends no close frame back: do not wait for one
        try:
            connection.close()
        except Exception:
            pass


def by_group(received: list[Received]) -> dict[str, list[Received]]:
    groups: dict[str, list[Received]] = {}
    for item in received:
        groups.setdefault(item.group, []).append(item)
    return groups


def owners(received: list[Received]) -> dict[str, set[str]]:
    """group -> names of the consumers that got any of its messages."""
    result: dict[str, set[str]] = {}
    for item in received:
        result.setdefault(item.group, set()).add(item.consumer.name)
    return result
