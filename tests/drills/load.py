"""Load for failover drills: producers and consumers over AMQP 1.0 that log every outcome.

They write the JSON-lines logs that tests/drills/checker.py judges (the format is described there).

Rules:
- Each GroupedProducer and LoggingConsumer is one thread running its own proton Container; every
  proton object is touched on that thread only. Other threads reach it through an EventInjector
  with one fixed event name (`stop()`), and read only plain counters.
- A send is never resent. A refusal is logged with its outcome and condition; a send in flight
  when the connection dies is logged as "timeout"; the group goes on with the next sequence.
- A consumer handles its deliveries one at a time in arrival order, accepts each unsettled
  (rcv-settle-mode second) and logs it once the node settles it ("settle_confirmed": true) or
  once its connection is gone (false). Its credit is a prefetch: one credit comes back per
  settlement, so what it holds unsettled plus its outstanding credit never exceed it.
- A message reaching a consumer after it closed its connection (a stop) is not taken: the node sent it
  before it saw the close and gives back whatever was unsettled then. It is logged as "dropped" with
  "after_close": true, its received_ms stamped when it came (after the close), so the checker can
  leave it out: the consumer never held it.
- A lost connection (or a link the node detaches) is retried after a backoff that doubles from
  RECONNECT_DELAY_MIN_S up to `reconnect_delay_max_s`, until the thread is stopped. `retarget(url)`
  points the retries at another address (a node reborn elsewhere, tests/drills/disk_loss.py): the one
  write another thread makes, a str the client's thread reads when it next connects.
- Every wait is bounded: outcomes at the end of a run, closing, joining, draining.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path

from proton import Delivery, Link, Message
from proton.handlers import MessagingHandler
from proton.reactor import ApplicationEvent, Container, EventInjector, LinkOption

STOP_EVENT = "drill_stop"
RECONNECT_DELAY_MIN_S = 0.05
CLOSE_WAIT_S = 2.0  # how long a closing connection may wait for the node's close frame
JOIN_MARGIN_S = 5.0  # stop() waits the thread's own bounds plus this
DRAIN_POLL_S = 0.05

OUTCOMES = {Delivery.ACCEPTED: "accepted", Delivery.REJECTED: "rejected", Delivery.RELEASED: "released",
            Delivery.MODIFIED: "modified"}


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class _Call:
    """A container timer task that runs `fn` unless cancelled first."""

    def __init__(self, fn):
        self.fn = fn
        self.cancelled = False

    def on_timer_task(self, event) -> None:
        if not self.cancelled:
            self.fn()


class _SettleSecond(LinkOption):
    def apply(self, link) -> None:
        link.rcv_settle_mode = Link.RCV_SECOND


class _Client(MessagingHandler):
    """One reconnecting AMQP connection with one named link, on its own container thread.

    Subclasses open the link (`_open_link`), log what a lost connection leaves behind (`_lost`),
    react to `stop()` (`_stop_requested`) and say when reconnecting has no point left (`_done`);
    `_finish()` closes and ends the container."""

    def __init__(self, url: str, name: str, log_path: str | Path, reconnect_delay_max_s: float,
                 heartbeat_s: float | None):
        super().__init__(prefetch=0, auto_accept=False, auto_settle=True)
        self.url = url
        self.name = name
        self.log_path = Path(log_path)
        self.reconnect_delay_max_s = reconnect_delay_max_s
        self.heartbeat_s = heartbeat_s
        self.connects = 0  # connections the node opened
        self.losses = 0  # connections that dropped or could not be made, closing aside
        self.stop_requested = False
        self.error: BaseException | None = None
        self._log = open(self.log_path, "w", buffering=1)
        self._last_ms = 0
        self._container: Container | None = None
        self._injector = EventInjector()
        # proton never closes the injector's pipe; run_container does, under this lock, so that a late
        # request_stop() never writes into a descriptor number the process has given to something else
        # (a long campaign of clients otherwise runs past select()'s 1024 descriptors)
        self._injector_lock = threading.Lock()
        self._injector_closed = False
        self._connection = None
        # more Container.connect keywords for every (re)connection, set before start(): TLS (ssl_domain,
        # sni) for a secured node; each client needs its own SSLDomain (one per container thread)
        self.connect_options: dict = {}
        self.link = None
        self._reconnect_delay_s = RECONNECT_DELAY_MIN_S
        self._finishing = False
        self._transport_condition = None
        # when this side began ending the connection (its close, or the node's detach of its link):
        # the node may act on the end, e.g. hand a consumer's groups to another, before the transport
        # has closed here, so a detach is stamped with its beginning
        self._ending_since_ms: int | None = None

    # ---- for other threads -------------------------------------------------------------------

    def run_container(self) -> None:
        try:
            self._container = Container(self)
            self._container.selectable(self._injector)
            self._container.run()
        except BaseException as error:  # reported by stop() and by Load.finish()
            self.error = error
        finally:
            self._log.close()
            with self._injector_lock:
                self._injector_closed = True
                for descriptor in self._injector.pipe:
                    os.close(descriptor)

    def request_stop(self) -> None:
        with self._injector_lock:
            if not self._injector_closed:
                self._injector.trigger(ApplicationEvent(STOP_EVENT))

    # ---- reactor thread ----------------------------------------------------------------------

    def _now_ms(self) -> int:
        self._last_ms = max(self._last_ms, now_ms())  # never backwards within one log
        return self._last_ms

    def _write(self, record: dict) -> None:
        self._log.write(json.dumps(record, separators=(",", ":")) + "\n")

    def _schedule(self, delay_s: float, fn) -> _Call:
        call = _Call(fn)
        self._container.schedule(delay_s, call)
        return call

    def on_start(self, event) -> None:
        self._connect()

    def _connect(self) -> None:
        if self._finishing:
            return
        self._transport_condition = None
        self._ending_since_ms = None
        self._connection = self._container.connect(self.url, reconnect=False, heartbeat=self.heartbeat_s,
                                                   **self.connect_options)
        self.link = self._open_link(self._connection)

    def on_connection_opened(self, event) -> None:
        self.connects += 1
        self._reconnect_delay_s = RECONNECT_DELAY_MIN_S

    def on_transport_error(self, event) -> None:
        # expected whenever the node is away: remember why, say nothing
        condition = event.transport.condition
        self._transport_condition = condition.name if condition is not None else None

    def on_connection_remote_close(self, event) -> None:
        if event.connection == self._connection and event.connection.remote_condition is not None:
            self._transport_condition = event.connection.remote_condition.name
        event.connection.close()

    def on_link_remote_close(self, event) -> None:
        if event.link == self.link and self._connection is not None and not self._finishing:
            condition = event.link.remote_condition
            self._transport_condition = condition.name if condition is not None else "link detached"
            self._ending_since_ms = self._now_ms()
            self._connection.close()  # start over with a fresh connection

    def on_transport_closed(self, event) -> None:
        if self._connection is None or (event.connection is not None and event.connection != self._connection):
            return
        self._connection = None
        self.link = None
        if not self._finishing:
            self.losses += 1
        self._lost(self._transport_condition or "connection lost")
        if self._finishing:
            self._container.stop()
        elif self.stop_requested or self._done():
            self._finish()
        else:
            delay_s = self._reconnect_delay_s
            self._reconnect_delay_s = min(2 * delay_s, self.reconnect_delay_max_s)
            self._schedule(delay_s, self._connect)

    def on_drill_stop(self, event) -> None:
        if not self.stop_requested:
            self.stop_requested = True
            self._stop_requested()

    def _finish(self) -> None:
        """Close and end the container; a node that does not answer the close is not waited for."""
        if self._finishing:
            return
        self._finishing = True
        self._injector.close()
        if self._connection is None:
            self._container.stop()
            return
        if self._ending_since_ms is None:
            self._ending_since_ms = self._now_ms()
        self._connection.close()
        self._schedule(CLOSE_WAIT_S, self._container.stop)

    def _done(self) -> bool:
        """True once there is no point in reconnecting, stop or not."""
        return False

    def _open_link(self, connection):
        raise NotImplementedError

    def _lost(self, condition: str) -> None:
        raise NotImplementedError

    def _stop_requested(self) -> None:
        raise NotImplementedError


class _ProducerClient(_Client):
    def __init__(self, url, queue, groups, log_path, *, name, in_flight_max, duration_s, messages_max, seed,
                 body_bytes, reconnect_delay_max_s, heartbeat_s, settle_wait_max_s):
        super().__init__(url, name, log_path, reconnect_delay_max_s, heartbeat_s)
        if not groups:
            raise ValueError("a producer needs at least one group")
        self.queue = queue
        self.groups = list(groups)
        self.in_flight_max = in_flight_max
        self.duration_s = duration_s
        self.messages_max = messages_max
        self.body_bytes = body_bytes
        self.settle_wait_max_s = settle_wait_max_s
        self._rng = random.Random(seed) if seed is not None else None
        self._next_sequence = {group: 1 for group in self.groups}
        self._in_flight: dict[bytes, dict] = {}  # delivery tag -> the send's log record, current link only
        self._sending = True
        self.sent = 0
        # every key there from the start: other threads copy this dict while the reactor counts
        self.outcomes = {outcome: 0 for outcome in [*OUTCOMES.values(), "timeout", "unknown"]}

    def on_start(self, event) -> None:
        super().on_start(event)
        if self.duration_s is not None:
            self._schedule(self.duration_s, self._stop_sending)

    def _open_link(self, connection):
        return self._container.create_sender(connection, self.queue, name=self.name)

    def on_sendable(self, event) -> None:
        if event.link == self.link:
            self._send_some()

    def _send_some(self) -> None:
        link = self.link
        while (self._sending and link is not None and link.credit > 0 and len(self._in_flight) < self.in_flight_max
               and (self.messages_max is None or self.sent < self.messages_max)):
            self._send_one(link)
        if self.messages_max is not None and self.sent >= self.messages_max:
            self._stop_sending()

    def _send_one(self, link) -> None:
        group = self._rng.choice(self.groups) if self._rng else self.groups[self.sent % len(self.groups)]
        sequence = self._next_sequence[group]
        self._next_sequence[group] = sequence + 1
        message = Message(body=f"{self.name} {group} {sequence} ".ljust(self.body_bytes, "."), durable=True,
                          properties={"producer": self.name, "sequence": sequence})
        message.group_id = group
        record = {"kind": "send", "producer": self.name, "node": self.url, "queue": self.queue, "group": group,
                  "sequence": sequence, "sent_ms": self._now_ms()}
        delivery = link.send(message)
        self._in_flight[delivery.tag] = record
        self.sent += 1

    def on_settled(self, event) -> None:
        delivery = event.delivery
        if event.link != self.link or delivery.tag not in self._in_flight:
            return
        condition = delivery.remote.condition
        self._log_outcome(self._in_flight.pop(delivery.tag), OUTCOMES.get(delivery.remote_state, "unknown"),
                          condition.name if condition is not None else None,
                          condition.description if condition is not None else None)
        if self._sending:
            self._send_some()
        elif not self._in_flight:
            self._finish()

    def _log_outcome(self, record: dict, outcome: str, condition: str | None, description: str | None = None) -> None:
        self.outcomes[outcome] += 1
        line = {**record, "settled_ms": self._now_ms(), "outcome": outcome, "condition": condition}
        if description:  # a refusal may say its outcome is unknown (the checker reads that)
            line["description"] = description
        self._write(line)

    def _time_out_in_flight(self, condition: str) -> None:
        for record in self._in_flight.values():
            self._log_outcome(record, "timeout", condition)
        self._in_flight.clear()

    def _lost(self, condition: str) -> None:
        self._time_out_in_flight(condition)

    def _done(self) -> bool:
        return not self._sending

    def _stop_requested(self) -> None:
        self._stop_sending()

    def _stop_sending(self) -> None:
        if not self._sending:
            return
        self._sending = False
        if not self._in_flight or self.link is None:
            self._finish()
            return

        def give_up():
            self._time_out_in_flight(f"no outcome within {self.settle_wait_max_s} s")
            self._finish()
        self._schedule(self.settle_wait_max_s, give_up)


class _ConsumerClient(_Client):
    def __init__(self, url, queue, log_path, *, name, credit, delay_ms, reconnect_delay_max_s, heartbeat_s,
                 settle_wait_max_s, events_path=None):
        super().__init__(url, name, log_path, reconnect_delay_max_s, heartbeat_s)
        if credit < 1:
            raise ValueError(f"credit must be at least 1, got {credit}")
        self.queue = queue
        # attach/detach lines for `grouper audit` (pipeline/audit.py), apart from the deliveries the checker reads
        self.events_path = Path(events_path) if events_path is not None else None
        if self.events_path is not None:
            self.events_path.write_text("")
        self.credit = credit
        self.delay_ms = delay_ms
        self.settle_wait_max_s = settle_wait_max_s
        self._waiting: list[tuple[dict, Delivery]] = []  # received, not yet accepted, arrival order
        self._accepted: dict[bytes, dict] = {}  # delivery tag -> record, until the node settles it
        self._processing: _Call | None = None
        self.received = 0
        self.last_received_monotonic_s = time.monotonic()

    def _open_link(self, connection):
        link = self._container.create_receiver(connection, self.queue, name=self.name, options=[_SettleSecond()])
        link.flow(self.credit)  # before the attach leaves: the node learns consumer and credit together
        return link

    def _write_event(self, kind: str, **fields) -> None:
        if self.events_path is not None:  # rare (a few per connection): open, append, close
            with open(self.events_path, "a") as events:
                events.write(json.dumps({"kind": kind, "consumer": self.name, "node": self.url, "queue": self.queue,
                                         "at_ms": self._now_ms(), **fields}, separators=(",", ":")) + "\n")

    def on_link_opened(self, event) -> None:
        if event.link == self.link:
            self._write_event("attach")

    def on_message(self, event) -> None:
        if event.link != self.link:
            return
        message = event.message
        properties = message.properties or {}
        record = {"kind": "delivery", "consumer": self.name, "node": self.url, "queue": self.queue,
                  "group": message.group_id, "producer": properties.get("producer"),
                  "sequence": properties.get("sequence"), "received_ms": self._now_ms(),
                  "delivery_count": message.delivery_count}
        if self._finishing:  # sent before the node saw this side's close, which gives it back
            self._write({**record, "settled_ms": record["received_ms"], "confirmed_ms": None, "outcome": "dropped",
                         "settle_confirmed": False, "after_close": True})
            return
        self.received += 1
        self.last_received_monotonic_s = time.monotonic()
        self._waiting.append((record, event.delivery))
        self._work()

    def _work(self) -> None:
        if self.delay_ms <= 0:
            while self._waiting:
                self._accept(*self._waiting.pop(0))
        elif self._waiting and self._processing is None:
            self._processing = self._schedule(self.delay_ms / 1000, self._processed)

    def _processed(self) -> None:
        self._processing = None
        if self._waiting:
            self._accept(*self._waiting.pop(0))
        self._work()

    def _accept(self, record: dict, delivery: Delivery) -> None:
        record["settled_ms"] = self._now_ms()
        delivery.update(Delivery.ACCEPTED)
        self._accepted[delivery.tag] = record

    def on_settled(self, event) -> None:
        record = self._accepted.pop(event.delivery.tag, None) if event.link == self.link else None
        if record is None:
            return
        self._write({**record, "confirmed_ms": self._now_ms(), "outcome": "accepted", "settle_confirmed": True})
        if not self.stop_requested:
            self.link.flow(1)  # the node's view: unsettled plus credit stay at the prefetch
        elif not self._waiting and not self._accepted:
            self._finish()

    def _lost(self, condition: str) -> None:
        self._write_event("detach", condition=condition, at_ms=self._ending_since_ms or self._now_ms())
        if self._processing is not None:
            self._processing.cancelled = True
            self._processing = None
        now = self._now_ms()
        for record, _ in self._waiting:
            self._write({**record, "settled_ms": now, "confirmed_ms": None, "outcome": "dropped",
                         "settle_confirmed": False})
        for record in self._accepted.values():
            self._write({**record, "confirmed_ms": None, "outcome": "accepted", "settle_confirmed": False})
        self._waiting.clear()
        self._accepted.clear()

    def _stop_requested(self) -> None:
        if self.link is None or (not self._waiting and not self._accepted):
            self._finish()
        else:
            self._schedule(self.settle_wait_max_s, self._finish)  # what is still held then is logged as lost


# ---- the threads ---------------------------------------------------------------------------------

class _ClientThread(threading.Thread):
    client: _Client

    def run(self) -> None:
        self.client.run_container()

    @property
    def log_path(self) -> Path:
        return self.client.log_path

    @property
    def error(self) -> BaseException | None:
        return self.client.error

    @property
    def connects(self) -> int:
        return self.client.connects

    def state(self) -> str:
        """What a failed drill prints about this client: enough to tell a dead thread, a connection the
        node never answered and a retry loop apart."""
        client = self.client
        return (f"{self.name}: alive {self.is_alive()}, error {self.error!r}, connects {client.connects}, "
                f"losses {client.losses}, connection {'open' if client._connection is not None else 'none'}, "
                f"last condition {client._transport_condition!r}")

    def retarget(self, url: str) -> None:
        """Connect to `url` from the next connection on (the current one, if any, is left as it is)."""
        self.client.url = url

    def stop(self, timeout_s: float | None = None) -> None:
        """Ask the thread to finish and wait for it; raises if it does not end in time or failed."""
        if self.is_alive():
            self.client.request_stop()
        self.join(self._stop_bound_s() if timeout_s is None else timeout_s)
        if self.is_alive():
            raise RuntimeError(f"{self.name} did not stop in time")
        if self.error is not None:
            raise RuntimeError(f"{self.name} failed: {self.error!r}") from self.error

    def _stop_bound_s(self) -> float:
        return self.client.settle_wait_max_s + CLOSE_WAIT_S + JOIN_MARGIN_S


class GroupedProducer(_ClientThread):
    """Sends to `queue` at `url` over `groups` (round-robin, or seeded random choice), each message
    with the next sequence of its group, at most `in_flight_max` unsettled, until `duration_s` has
    passed, `messages_max` were sent or `stop()`; logs every outcome to `log_path`."""

    def __init__(self, url: str, queue: str, groups: list[str], log_path: str | Path, *, name: str = "producer",
                 in_flight_max: int = 20, duration_s: float | None = None, messages_max: int | None = None,
                 seed: int | None = None, body_bytes: int = 64, reconnect_delay_max_s: float = 1.0,
                 heartbeat_s: float | None = None, settle_wait_max_s: float = 10.0):
        super().__init__(name=name, daemon=True)
        self.client = _ProducerClient(url, queue, groups, log_path, name=name, in_flight_max=in_flight_max,
                                      duration_s=duration_s, messages_max=messages_max, seed=seed,
                                      body_bytes=body_bytes, reconnect_delay_max_s=reconnect_delay_max_s,
                                      heartbeat_s=heartbeat_s, settle_wait_max_s=settle_wait_max_s)

    @property
    def sent(self) -> int:
        return self.client.sent

    @property
    def outcomes(self) -> dict[str, int]:
        """Sends per logged outcome so far ("accepted", "rejected", ..., "timeout")."""
        return dict(self.client.outcomes)


class LoggingConsumer(_ClientThread):
    """Receives from `queue` at `url` with `credit` as its prefetch, waits `delay_ms` per message,
    accepts it and logs the delivery to `log_path`, until `stop()`."""

    def __init__(self, url: str, queue: str, log_path: str | Path, *, name: str = "consumer", credit: int = 10,
                 delay_ms: int = 0, reconnect_delay_max_s: float = 1.0, heartbeat_s: float | None = None,
                 settle_wait_max_s: float = 5.0, events_path: str | Path | None = None):
        super().__init__(name=name, daemon=True)
        self.client = _ConsumerClient(url, queue, log_path, name=name, credit=credit, delay_ms=delay_ms,
                                      reconnect_delay_max_s=reconnect_delay_max_s, heartbeat_s=heartbeat_s,
                                      settle_wait_max_s=settle_wait_max_s, events_path=events_path)

    @property
    def received(self) -> int:
        return self.client.received

    @property
    def last_received_monotonic_s(self) -> float:
        return self.client.last_received_monotonic_s


def wait_accepted(producers: list[GroupedProducer], more: int, timeout_s: float, what: str) -> None:
    """Until each of `producers` has `more` accepted sends beyond what it has now; AssertionError after
    `timeout_s` without that progress, naming `what` and the producers still behind."""
    targets = [(producer, producer.outcomes["accepted"] + more) for producer in producers]
    deadline = time.monotonic() + timeout_s
    while True:
        behind = [(producer.name, producer.outcomes) for producer, target in targets
                  if producer.outcomes["accepted"] < target]
        if not behind:
            return
        assert time.monotonic() < deadline, f"no progress within {timeout_s} s ({what}); behind: {behind}"
        time.sleep(0.05)


def drain(consumers: list[LoggingConsumer], quiet_s: float = 1.0, timeout_s: float = 30.0) -> bool:
    """Let the consumers run until none has received anything for `quiet_s`; False if `timeout_s`
    passed first."""
    deadline = time.monotonic() + timeout_s
    while True:
        now = time.monotonic()
        last = max((consumer.last_received_monotonic_s for consumer in consumers), default=now - quiet_s)
        if now - last >= quiet_s:
            return True
        if now >= deadline:
            return False
        time.sleep(min(DRAIN_POLL_S, quiet_s))


# ---- a whole load ----------------------------------------------------------------------------------

class Load:
    """Producers and consumers started together; `finish()` stops the producers, drains and stops the
    consumers, and returns the log paths. As a context manager it finishes on exit."""

    def __init__(self, producers: list[GroupedProducer], consumers: list[LoggingConsumer]):
        self.producers = producers
        self.consumers = consumers
        self.finished = False

    @property
    def send_paths(self) -> list[Path]:
        return [producer.log_path for producer in self.producers]

    @property
    def delivery_paths(self) -> list[Path]:
        return [consumer.log_path for consumer in self.consumers]

    @property
    def event_paths(self) -> list[Path]:
        """The consumers' attach/detach logs, for `grouper audit` (the checker does not read them)."""
        return [consumer.client.events_path for consumer in self.consumers if consumer.client.events_path]

    def accepted(self) -> int:
        return sum(producer.outcomes.get("accepted", 0) for producer in self.producers)

    def start(self) -> "Load":
        for thread in [*self.consumers, *self.producers]:
            thread.start()
        return self

    def finish(self, quiet_s: float = 1.0, timeout_s: float = 30.0) -> tuple[list[Path], list[Path]]:
        if self.finished:
            return self.send_paths, self.delivery_paths
        self.finished = True
        errors = []
        for thread in self.producers:
            errors += _stopped(thread)
        if not drain(self.consumers, quiet_s, timeout_s):
            errors.append(f"the consumers were still receiving after {timeout_s} s")
        for thread in self.consumers:
            errors += _stopped(thread)
        if errors:
            raise RuntimeError("; ".join(errors))
        return self.send_paths, self.delivery_paths

    def __enter__(self) -> "Load":
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.finish()
        else:  # the drill failed: stop everything, keep the original error
            self.finished = True
            for thread in [*self.producers, *self.consumers]:
                _stopped(thread)


def _stopped(thread: _ClientThread) -> list[str]:
    try:
        thread.stop()
    except RuntimeError as error:
        return [str(error)]
    return []


def start_load(producers: list[tuple], consumers: list[tuple], directory: str | Path, *, in_flight_max: int = 20,
               seed: int | None = None, reconnect_delay_max_s: float = 1.0, connect_options=None) -> Load:
    """Start producers `(url, queue, groups)` named p0, p1, ... and consumers `(url, queue, credit)`
    or `(url, queue, credit, delay_ms)` named c0, c1, ...; logs go to `directory`/NAME.jsonl.
    With `seed`, producer i picks groups at random with seed + i; without, round-robin.
    `connect_options(url)`, if given, makes each client's Container.connect keywords (TLS)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    started_producers = [
        GroupedProducer(url, queue, groups, directory / f"p{index}.jsonl", name=f"p{index}",
                        in_flight_max=in_flight_max, seed=None if seed is None else seed + index,
                        reconnect_delay_max_s=reconnect_delay_max_s)
        for index, (url, queue, groups) in enumerate(producers)]
    started_consumers = [
        LoggingConsumer(spec[0], spec[1], directory / f"c{index}.jsonl", name=f"c{index}", credit=spec[2],
                        delay_ms=spec[3] if len(spec) > 3 else 0, reconnect_delay_max_s=reconnect_delay_max_s,
                        events_path=directory / f"c{index}.events.jsonl")
        for index, spec in enumerate(consumers)]
    if connect_options is not None:
        for client in [*started_producers, *started_consumers]:
            client.client.connect_options = connect_options(client.client.url)
    return Load(started_producers, started_consumers).start()


def log_admin_action(path: str | Path, action: str, queue: str, group: str | None = None) -> None:
    """Append an admin line for `grouper audit`: a management command (reset, move) that frees `group`
    of `queue`, or every group when `group` is None, was run now. Call it just before the command."""
    with open(path, "a") as log:
        log.write(json.dumps({"kind": "admin", "action": action, "queue": queue, "group": group, "at_ms": now_ms()},
                             separators=(",", ":")) + "\n")


def run_load(producers: list[tuple], consumers: list[tuple], duration_s: float, directory: str | Path,
             **options) -> tuple[list[Path], list[Path]]:
    """`start_load`, let it run `duration_s`, then `finish()`: returns (send_paths, delivery_paths)."""
    load = start_load(producers, consumers, directory, **options)
    with load:
        time.sleep(duration_s)
    return load.send_paths, load.delivery_paths
