"""Probe clients: proton clients, each in a process of its own, that send one message at a time or
consume with a redial, and record every outcome with CLOCK_MONOTONIC times (which every process on
the machine shares), so a phase can time a route decision, a forward or a failover to the message.
`Probes` starts a phase's probe processes and loads what each recorded: the records come back as
pickle files in the phase's scratch directory, what a phase watches live in shared arrays."""

from __future__ import annotations

import multiprocessing
import pickle
import time
from array import array
from pathlib import Path

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

from bench import clients
from bench.cluster_nodes import NodeProcess
from bench.workloads import PREFETCH


SETTLE_WAIT_S = 10.0  # a stopping probe producer waits this long for outcomes of what it sent
RECONNECT_INTERVAL_S = 0.05  # a probe consumer redials a killed node this often
TIMER_INTERVAL_S = 0.05

ACCEPTED, REJECTED, RELEASED, MODIFIED = 1, 2, 3, 4


def _dump(path: str, value: dict) -> None:
    with open(path, "wb") as handle:
        pickle.dump(value, handle, protocol=pickle.HIGHEST_PROTOCOL)


def _load(path) -> dict | None:
    try:
        with open(path, "rb") as handle:
            return pickle.load(handle)
    except (OSError, EOFError, pickle.UnpicklingError):
        return None


def probe_producer(url: str, queue: str, groups, interval_s: float, ready, go, stop, accepted_after,
                   result_path: str) -> None:
    """Send one message every `interval_s`: of groups[i] in turn, or (groups a str) of a brand-new
    group `<groups>-<i>` each time, until the list ends or `stop` is set. Records, per message, the
    send and settle times (CLOCK_MONOTONIC ns) and the outcome. `accepted_after` is a shared
    [since_ns, first_accept_ns, accepted_count]: the producer fills in the first acceptance of a
    message sent at or after since_ns, so the parent can tell when traffic resumed."""
    endless = isinstance(groups, str)
    sent_ns, settled_ns, states = array("q"), array("q"), array("b")
    body = b"x" * 100

    class Producer(MessagingHandler):
        def __init__(self):
            super().__init__(prefetch=0)
            self.sender = self.connection = None
            self.error = ""
            self.unsettled = 0
            self.stopping_since = 0.0

        def on_start(self, event):
            self.connection = event.container.connect(url, reconnect=False)
            self.sender = event.container.create_sender(self.connection, queue, name="probe-producer")
            event.container.schedule(TIMER_INTERVAL_S, self)

        def on_link_opened(self, event):
            ready.set()

        def on_timer_task(self, event):
            sending = go.is_set() and not stop.is_set() and (endless or len(sent_ns) < len(groups))
            if sending:
                if self.sender.credit > 0:
                    self._send_one()
                event.container.schedule(interval_s, self)
                return
            if not go.is_set():
                event.container.schedule(TIMER_INTERVAL_S, self)
                return
            if not self.stopping_since:
                self.stopping_since = time.monotonic()
            if self.unsettled and time.monotonic() - self.stopping_since < SETTLE_WAIT_S:
                event.container.schedule(TIMER_INTERVAL_S, self)
            else:
                self.connection.close()

        def _send_one(self):
            index = len(sent_ns)
            message = Message(body=body, durable=True)
            message.group_id = f"{groups}-{index}" if endless else groups[index]
            now = time.monotonic_ns()
            message.properties = {clients.SENT_KEY: now, clients.SEQ_KEY: index}
            self.sender.send(message, tag=str(index).encode())
            sent_ns.append(now)
            settled_ns.append(0)
            states.append(0)
            self.unsettled += 1

        def _settled(self, event, state):
            now = time.monotonic_ns()
            tag = event.delivery.tag
            index = int(tag.decode() if isinstance(tag, bytes) else tag)
            if states[index]:
                return
            settled_ns[index], states[index] = now, state
            self.unsettled -= 1
            if state == ACCEPTED:
                accepted_after[2] += 1
                if not accepted_after[1] and accepted_after[0] and sent_ns[index] >= accepted_after[0]:
                    accepted_after[1] = now

        def on_accepted(self, event):
            self._settled(event, ACCEPTED)

        def on_rejected(self, event):
            self._settled(event, REJECTED)

        def on_released(self, event):
            self._settled(event, RELEASED)

        def on_modified(self, event):
            self._settled(event, MODIFIED)

        def on_transport_error(self, event):
            self.error = str(event.transport.condition)

    producer = Producer()
    try:
        Container(producer).run()
    except Exception as error:  # recorded, not raised: a benchmark reports failures
        producer.error = f"{type(error).__name__}: {error}"
    _dump(result_path, {"sent_ns": list(sent_ns), "settled_ns": list(settled_ns), "states": list(states),
                        "error": producer.error})


def probe_consumer(url: str, queue: str, prefetch: int, ready, stop, watch, result_path: str) -> None:
    """One consumer that accepts everything, redials its node every RECONNECT_INTERVAL_S when the
    connection drops, and records each message (group, probe index, sent and received ns) and each
    attach and disconnect time. `watch` is a shared [since_ns, first receipt after since_ns, first
    receipt of a message sent after since_ns, receipts]: the parent sets since_ns and watches."""
    groups, indexes, sent, received = [], array("q"), array("q"), array("q")
    attached_ns, disconnected_ns, errors = [], [], []

    class Redial:
        def __init__(self, consumer):
            self.consumer = consumer

        def on_timer_task(self, event):
            self.consumer.redial_pending = False
            self.consumer.connect(event.container)

    class Consumer(MessagingHandler):
        def __init__(self):
            super().__init__(prefetch=0, auto_accept=False)
            self.connection = None
            self.redial_pending = False  # proton reports one drop as tail-closed, then closed

        def connect(self, container):
            if stop.is_set():
                return
            self.connection = container.connect(url, reconnect=False)
            receiver = container.create_receiver(self.connection, queue, name="probe-consumer")
            receiver.flow(prefetch)

        def on_start(self, event):
            self.connect(event.container)
            event.container.schedule(TIMER_INTERVAL_S, self)

        def on_link_opened(self, event):
            attached_ns.append(time.monotonic_ns())
            ready.set()

        def on_message(self, event):
            now = time.monotonic_ns()
            properties = event.message.properties or {}
            self.accept(event.delivery)
            event.receiver.flow(1)
            sent_ns = properties.get(clients.SENT_KEY, 0)
            groups.append(event.message.group_id)
            indexes.append(properties.get(clients.SEQ_KEY, -1))
            sent.append(sent_ns)
            received.append(now)
            watch[3] += 1
            since = watch[0]
            if since and now >= since:
                if not watch[1]:
                    watch[1] = now
                if not watch[2] and sent_ns >= since:
                    watch[2] = now

        def on_disconnected(self, event):
            if event.connection == self.connection and not self.redial_pending and not stop.is_set():
                disconnected_ns.append(time.monotonic_ns())
                self.redial_pending = True
                event.container.schedule(RECONNECT_INTERVAL_S, Redial(self))

        def on_transport_error(self, event):
            errors.append(str(event.transport.condition))

        def on_timer_task(self, event):
            if stop.is_set():
                if self.connection is not None:
                    self.connection.close()
            else:
                event.container.schedule(TIMER_INTERVAL_S, self)

    try:
        Container(Consumer()).run()
    except Exception as error:
        errors.append(f"{type(error).__name__}: {error}")
    _dump(result_path, {"groups": groups, "indexes": list(indexes), "sent_ns": list(sent),
                        "received_ns": list(received), "attached_ns": attached_ns,
                        "disconnected_ns": disconnected_ns, "errors": errors[-5:]})


class Probes:
    """Probe processes of one phase; `stop()` ends them and loads what each recorded."""

    def __init__(self, scratch_dir: Path):
        self.context = multiprocessing.get_context("fork")
        self.scratch_dir = scratch_dir
        scratch_dir.mkdir(parents=True, exist_ok=True)
        self.stop_event = self.context.Event()
        self.processes: list = []
        self.paths: dict[str, Path] = {}

    def consumer(self, name: str, node: NodeProcess, queue: str, prefetch: int = PREFETCH):
        """Returns (ready, watch); see probe_consumer."""
        ready = self.context.Event()
        watch = self.context.RawArray("q", 4)
        path = self.scratch_dir / f"{name}.pickle"
        path.unlink(missing_ok=True)
        process = self.context.Process(target=probe_consumer, name=name,
                                       args=(node.url, queue, prefetch, ready, self.stop_event, watch, str(path)))
        process.start()
        self.processes.append(process)
        self.paths[name] = path
        return ready, watch

    def producer(self, name: str, node: NodeProcess, queue: str, groups, interval_s: float):
        """Returns (go, stop, accepted_after, process); the producer connects at once and sends after go."""
        ready, go, stop = self.context.Event(), self.context.Event(), self.context.Event()
        accepted_after = self.context.RawArray("q", 3)
        path = self.scratch_dir / f"{name}.pickle"
        path.unlink(missing_ok=True)
        process = self.context.Process(target=probe_producer, name=name,
                                       args=(node.url, queue, groups, interval_s, ready, go, stop, accepted_after,
                                             str(path)))
        process.start()
        self.processes.append(process)
        self.paths[name] = path
        if not ready.wait(clients.READY_TIMEOUT_S):
            raise RuntimeError(f"probe producer {name} did not attach to {node.name}")
        return go, stop, accepted_after, process

    def finish_producer(self, name: str, stop, process, run_out_s: float = 0.0) -> dict:
        """Let a producer with a list run it out (up to `run_out_s`), then stop it and load its record."""
        process.join(run_out_s)
        stop.set()
        process.join(SETTLE_WAIT_S + clients.JOIN_TIMEOUT_S)
        if process.is_alive():
            process.terminate()
            process.join(5)
        return _load(self.paths[name]) or {"sent_ns": [], "settled_ns": [], "states": [], "error": "no result"}

    def finish(self) -> dict[str, dict]:
        self.stop_event.set()
        for process in self.processes:
            process.join(clients.JOIN_TIMEOUT_S)
            if process.is_alive():
                process.terminate()
                process.join(5)
        return {name: _load(path) for name, path in self.paths.items()}
