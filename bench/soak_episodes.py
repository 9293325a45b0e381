"""The soak's episodes: short-lived client subprocesses (`python3 -m bench.soak episode ROLE ...`), one
role each:
  `killed`    a producer and a consumer on one connection, ended with kill -9 at a seeded moment;
  `detach`    links ended with a detach that does not close them (closed=false), attached again;
  `large`     1 MB bodies over a connection whose max-frame-size is 16 KiB (multi-frame transfers);
  `heartbeat` a connection with an idle timeout that stays idle longer than it, and must survive.

Rules:
- Episodes pre-log what a kill -9 could leave unknown: a send as "timeout" before it leaves (the
  node's acceptance, logged later, wins), a delivery as an unconfirmed acceptance before the accept
  leaves. So a killed client's logs never claim more than the node may have done.
- Each episode logs to files of its own (episodes/NAME.sends.jsonl, .deliveries.jsonl). A kill -9 can
  tear a line in the middle of a write that crosses a page of the file, and only a file's last line
  may be torn: the next episode's lines would follow it if they shared a file.
- The handlers are built on first use, so the orchestrator (soak_run.py) never imports proton's reactor.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

QUEUE = "soak"  # the steady load and the killed and detach episodes
LARGE_QUEUE = "soak-large"
IDLE_QUEUE = "soak-idle"
GROUPS = [f"g{index}" for index in range(16)]
EPISODE_TIMEOUT_S = 60.0  # an episode that has not ended by then failed (it is killed)
KILL_AFTER_MIN_S, KILL_AFTER_MAX_S = 0.5, 3.0  # when a `killed` episode dies, seeded
LARGE_BODY_BYTES = 1 << 20
LARGE_MESSAGES = 3  # per `large` episode
SMALL_FRAME_BYTES = 16 << 10  # max-frame-size of the `large` episode's connection
IDLE_TIMEOUT_S = 1.0  # the `heartbeat` episode's idle timeout ...
IDLE_FOR_S = 3.0  # ... and how long it stays idle: longer, so only the node's heartbeats keep it open
ROLES = ("killed", "detach", "large", "heartbeat")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def episode_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench.soak episode")
    parser.add_argument("role", choices=ROLES)
    parser.add_argument("--url", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--send-log", required=True)
    parser.add_argument("--delivery-log", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from proton.reactor import Container

    handler = _EPISODES[args.role](args)
    Container(handler).run()
    if handler.failure:
        print(f"{args.role} {args.name}: {handler.failure}", file=sys.stderr)
        return 1
    return 0


def _episode_classes():
    """The episode handlers, built on first use so the orchestrator never imports proton's reactor."""
    from proton import Delivery, Message
    from proton.handlers import MessagingHandler

    outcomes = {Delivery.ACCEPTED: "accepted", Delivery.REJECTED: "rejected", Delivery.RELEASED: "released",
                Delivery.MODIFIED: "modified"}

    class Episode(MessagingHandler):
        """Logs in the checker's format; a send and a delivery are logged before they can be lost."""

        def __init__(self, args, **options):
            super().__init__(prefetch=0, auto_accept=False, auto_settle=True)
            self.args = args
            self.name = args.name
            self.rng = random.Random(args.seed)
            self.failure = ""
            self.sends = open(args.send_log, "a", buffering=1)
            self.deliveries = open(args.delivery_log, "a", buffering=1)
            self.next_sequence: dict[str, int] = {}
            self.in_flight: dict = {}  # delivery tag -> send record
            self.connection = None
            self.options = options

        def on_start(self, event):
            self.container = event.container
            self.connection = event.container.connect(self.args.url, reconnect=False, **self.options)
            self.begin(event.container)

        def fail(self, reason: str) -> None:
            if not self.failure:
                self.failure = reason
            if self.connection is not None:
                self.connection.close()

        def on_transport_error(self, event):
            condition = event.transport.condition
            self.fail(f"transport error: {condition.name if condition else '?'}: "
                      f"{condition.description if condition else ''}")

        def on_connection_error(self, event):
            self.fail(f"connection closed by the node: {event.connection.remote_condition}")

        def on_link_error(self, event):
            self.fail(f"link {event.link.name} closed by the node: {event.link.remote_condition}")

        def send(self, link, queue: str, group: str, body_bytes: int = 64) -> None:
            sequence = self.next_sequence.get(group, 0) + 1
            self.next_sequence[group] = sequence
            record = {"kind": "send", "producer": self.name, "node": self.args.url, "queue": queue, "group": group,
                      "sequence": sequence, "sent_ms": now_ms()}
            self.sends.write(json.dumps({**record, "settled_ms": record["sent_ms"], "outcome": "timeout",
                                         "condition": "not settled before the client ended"}) + "\n")
            message = Message(body=f"{self.name} {group} {sequence} ".ljust(body_bytes, "."), durable=True,
                              properties={"producer": self.name, "sequence": sequence})
            message.group_id = group
            delivery = link.send(message)
            self.in_flight[delivery.tag] = record

        def on_settled(self, event):
            record = self.in_flight.pop(event.delivery.tag, None)
            if record is None:
                return
            condition = event.delivery.remote.condition
            self.sends.write(json.dumps({**record, "settled_ms": now_ms(),
                                         "outcome": outcomes.get(event.delivery.remote_state, "unknown"),
                                         "condition": condition.name if condition else None}) + "\n")
            self.sent_settled(event)

        def sent_settled(self, event) -> None:
            pass

        def log_accept(self, event, queue: str) -> None:
            """An acceptance the node may or may not see (the accept leaves after this line)."""
            message = event.message
            properties = message.properties or {}
            at_ms = now_ms()
            self.deliveries.write(json.dumps({
                "kind": "delivery", "consumer": self.name, "node": self.args.url, "queue": queue,
                "group": message.group_id, "producer": properties.get("producer"),
                "sequence": properties.get("sequence"), "received_ms": at_ms, "settled_ms": at_ms,
                "confirmed_ms": None, "delivery_count": message.delivery_count, "outcome": "accepted",
                "settle_confirmed": False}) + "\n")
            self.accept(event.delivery)

        def finish(self) -> None:
            if self.connection is not None:
                self.connection.close()

    class Killed(Episode):
        """Sends and receives on QUEUE until the orchestrator kills it with SIGKILL."""

        IN_FLIGHT_MAX = 2
        CREDIT = 10

        def begin(self, container):
            self.sender = container.create_sender(self.connection, QUEUE, name=f"{self.name}-out")
            self.receiver = container.create_receiver(self.connection, QUEUE, name=f"{self.name}-in")
            self.receiver.flow(self.CREDIT)

        def on_sendable(self, event):
            self.send_some()

        def sent_settled(self, event):
            self.send_some()

        def send_some(self):
            while self.sender.credit > 0 and len(self.in_flight) < self.IN_FLIGHT_MAX:
                self.send(self.sender, QUEUE, self.rng.choice(GROUPS))

        def on_message(self, event):
            self.log_accept(event, QUEUE)
            event.link.flow(1)

    class Detach(Episode):
        """Suspends its links (detach, closed=false) and attaches them again a few times, then closes."""

        ROUNDS = 3
        MESSAGES_PER_ROUND = 4
        ROUND_WAIT_S = 1.0  # a round ends when it has its messages or after this long

        def begin(self, container):
            self.round = 0
            self.start_round()

        def start_round(self):
            self.round += 1
            self.received = 0
            self.receiver = self.container.create_receiver(self.connection, QUEUE, name=f"{self.name}-in")
            self.receiver.flow(self.MESSAGES_PER_ROUND)
            self.sender = self.container.create_sender(self.connection, QUEUE, name=f"{self.name}-out")
            self.to_send = self.MESSAGES_PER_ROUND
            self.round_timer = self.container.schedule(self.ROUND_WAIT_S, self)

        def on_sendable(self, event):
            while event.link == self.sender and self.to_send > 0 and self.sender.credit > 0:
                self.to_send -= 1
                self.send(self.sender, QUEUE, self.rng.choice(GROUPS))

        def on_message(self, event):
            if event.link != self.receiver or self.round_timer is None:
                return  # arrived after this side's detach: the node releases it
            self.log_accept(event, QUEUE)
            self.received += 1
            if self.received >= self.MESSAGES_PER_ROUND:
                self.end_round()

        def on_timer_task(self, event):
            self.end_round()

        def end_round(self):
            if self.round_timer is None:
                return
            self.round_timer.cancel()
            self.round_timer = None
            self.receiver.detach()  # closed=false: a suspended link, which the node ends at once
            self.sender.detach()
            self.detached = 0

        def on_link_remote_detach(self, event):
            self.detached += 1
            if self.detached < 2:
                return
            if self.round < self.ROUNDS:
                self.start_round()
            else:
                self.finish()

    class Large(Episode):
        """Sends LARGE_MESSAGES bodies of LARGE_BODY_BYTES and receives as many, over small frames."""

        def __init__(self, args):
            super().__init__(args, max_frame_size=SMALL_FRAME_BYTES)

        def begin(self, container):
            self.group = f"L{self.rng.randrange(4)}"
            self.to_send = LARGE_MESSAGES
            self.received = 0
            self.sender = container.create_sender(self.connection, LARGE_QUEUE, name=f"{self.name}-out")
            self.receiver = container.create_receiver(self.connection, LARGE_QUEUE, name=f"{self.name}-in")
            self.receiver.flow(1)

        def on_sendable(self, event):
            while event.link == self.sender and self.to_send > 0 and self.sender.credit > 0:
                self.to_send -= 1
                self.send(self.sender, LARGE_QUEUE, self.group, LARGE_BODY_BYTES)

        def on_message(self, event):
            if len(event.message.body) != LARGE_BODY_BYTES:
                self.fail(f"a body of {len(event.message.body)} bytes arrived, {LARGE_BODY_BYTES} were sent")
                return
            self.log_accept(event, LARGE_QUEUE)
            self.received += 1
            if self.received >= LARGE_MESSAGES:
                self.finish()
            else:
                event.link.flow(1)

    class Heartbeat(Episode):
        """Idle longer than its idle timeout; the node's empty frames must keep it open. Then one round trip."""

        def __init__(self, args):
            super().__init__(args, heartbeat=IDLE_TIMEOUT_S)

        def begin(self, container):
            self.receiver = container.create_receiver(self.connection, IDLE_QUEUE, name=f"{self.name}-in")
            self.receiver.flow(1)
            self.sender = None
            container.schedule(IDLE_FOR_S, self)

        def on_timer_task(self, event):
            if self.failure:
                return
            self.sender = self.container.create_sender(self.connection, IDLE_QUEUE, name=f"{self.name}-out")

        def on_sendable(self, event):
            if event.link == self.sender and not self.in_flight and not self.next_sequence:
                self.send(self.sender, IDLE_QUEUE, self.name)

        def on_message(self, event):
            self.log_accept(event, IDLE_QUEUE)
            self.finish()

    return {"killed": Killed, "detach": Detach, "large": Large, "heartbeat": Heartbeat}


class _LazyEpisodes(dict):
    def __missing__(self, role):
        self.update(_episode_classes())
        return self[role]


_EPISODES = _LazyEpisodes()
