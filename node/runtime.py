"""Wiring and lifecycle of one node: recover, listen, serve, stop.

Threads and what they own:
- the reactor thread: the proton container, every proton object, the `Broker` core;
- the journal writer thread: the journal file (it reports back through the bridge);
- gRPC pool threads: nothing; admin calls enter the reactor through `Bridge.call` with a deadline;
- the main thread: waits for SIGINT/SIGTERM, then asks the reactor to stop and waits for it.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time

from proton.reactor import Container

from node.amqp.bridge import Bridge
from node.amqp.server import AmqpServer
from node.config import NodeConfig
from node.core.broker import Broker
from node.core.errors import GrouperError
from node.core.settings import QueueSettings
from node.store.journal import Journal

log = logging.getLogger("grouper.node")

SHUTDOWN_GRACE_S = 0.3  # time for close frames to leave before the reactor stops
STOP_WAIT_S = 10.0  # how long the main thread waits for the reactor to finish


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


class ReactorControl:
    """NodeControl over the running reactor: each call runs on the reactor thread."""

    def __init__(self, node: "Node"):
        self._node = node

    def _call(self, fn):
        return self._node.bridge.call(fn, self._node.config.admin_timeout_ms)

    def list_queues(self):
        return self._call(self._node.broker.list_queues)

    def add_queue(self, settings: QueueSettings):
        def add():
            queue = self._node.broker.declare_queue(settings)
            self._node.server.apply([])  # journals the declaration
            return queue.stats()
        return self._call(add)

    def delete_queue(self, name: str):
        def delete():
            node = self._node
            durable = node.broker.queue(name).settings.durable
            node.server.apply(node.broker.delete_queue(name))
            node.server.detach_producers_of(name)
            if durable and node.journal is not None:
                node.journal.delete(name)
        return self._call(delete)

    def list_groups(self, queue: str):
        return self._call(lambda: self._node.broker.list_groups(queue))

    def _counted(self, fn):
        def run():
            count, effects = fn(self._node.clock_ms())
            self._node.server.apply(effects)
            return count
        return self._call(run)

    def reset_groups(self, queue, group):
        return self._counted(lambda now_ms: self._node.broker.reset_groups(queue, group, now_ms))

    def purge_group(self, queue, group, count):
        return self._counted(lambda now_ms: self._node.broker.purge_group(queue, group, count, now_ms))

    def move_group(self, queue, group, destination, count):
        return self._counted(lambda now_ms: self._node.broker.move_group(queue, group, destination, count, now_ms))


class Node:
    def __init__(self, config: NodeConfig, clock_ms=wall_clock_ms):
        self.config = config
        self.clock_ms = clock_ms
        self.broker = Broker(auto_create=config.auto_create, template=config.template_settings(),
                             default_group=config.default_group)
        self.journal = Journal(config.data_dir, fsync=config.journal_fsync,
                               compact_min_bytes=config.journal_compact_min_bytes)
        self.container = None
        self.bridge = None
        self.server = None
        self.acceptor = None
        self.amqp_port = None
        self.admin_server = None
        self.admin_port = None
        self._reactor_thread = None

    def recover(self) -> None:
        recovery = self.journal.recover()
        for settings in self.config.queues:
            self.broker.declare_queue(settings)
        journalled = set()
        for values in recovery.queues:
            settings = QueueSettings.from_dict(values, where=f"journal queue {values.get('name')!r}")
            journalled.add(settings)
            if settings.name not in self.broker.queues:
                self.broker.declare_queue(settings)
        # journal only what the journal does not hold yet: new or changed config-file queues
        self.broker.declared = [s for s in self.broker.declared if s not in journalled]
        restored = 0
        for name, messages in recovery.messages.items():
            if name not in self.broker.queues:
                log.warning("journal holds %d messages of undeclared queue %r; declaring it from the template",
                            len(messages), name)
                self.broker.queue(name, create=True)
            for message in messages:
                self.broker.restore(name, message)
                restored += 1
        log.info("recovered %d queues and %d messages from %s", len(self.broker.queues), restored,
                 self.config.data_dir)

    def start(self) -> None:
        from node.admin.service import serve

        self.server = AmqpServer(self.broker, self.journal, self.config, self.clock_ms, self._drain_bridge)
        self.container = Container(self.server)
        self.container.container_id = f"grouper-{os.getpid()}"
        self.bridge = Bridge(self.container)
        try:
            self.acceptor = self.container.listen(f"{self.config.host}:{self.config.amqp_port}")
        except Exception as error:
            raise GrouperError(f"cannot listen for AMQP on {self.config.host}:{self.config.amqp_port}: {error}; "
                               f"is another process using the port?") from None
        self.amqp_port = self.acceptor._selectable._delegate.getsockname()[1]
        self.admin_server, self.admin_port = serve(ReactorControl(self), self.config.host, self.config.admin_port)
        self.journal.start(on_durable=lambda ticket: self.bridge.post(lambda: self.server.journal_durable(ticket)),
                           on_failed=lambda ticket, reason: self.bridge.post(
                               lambda: self.server.journal_failed(ticket, reason)))
        self.server.apply([])  # journals the declarations made during recovery
        self._reactor_thread = threading.Thread(target=self._run_reactor, name="reactor", daemon=True)
        self._reactor_thread.start()

    def _drain_bridge(self) -> None:
        self.bridge.drain()

    def _run_reactor(self) -> None:
        try:
            self.container.run()
        except BaseException:
            log.exception("the reactor stopped on an unexpected error")
            os._exit(70)  # a broken invariant: stop the process, the supervisor restarts it

    def stop(self) -> None:
        def shutdown():
            self.server.stopping = True
            self.acceptor.close()
            self.server.close_connections()
            self.container.schedule(SHUTDOWN_GRACE_S, _Stopper(self.container, self.bridge))
        if self._reactor_thread is not None and self._reactor_thread.is_alive():
            self.bridge.post(shutdown)
            self._reactor_thread.join(STOP_WAIT_S)
        if self.admin_server is not None:
            self.admin_server.stop(grace=0.5)
        self.journal.close()

    def wait_alive(self, stop_event: threading.Event) -> None:
        while not stop_event.is_set() and self._reactor_thread.is_alive():
            stop_event.wait(0.5)


class _Stopper:
    def __init__(self, container, bridge):
        self._container = container
        self._bridge = bridge

    def on_timer_task(self, event):
        self._bridge.close()
        self._container.stop()


def run(config: NodeConfig) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    node = Node(config)
    try:
        node.recover()
        node.start()
    except GrouperError as error:
        print(f"grouper node: cannot start: {error.description}", file=sys.stderr)
        node.journal.close()
        return 1
    stop_event = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop_event.set())
    print(f"amqp: {config.host}:{node.amqp_port}", flush=True)
    print(f"admin: {config.host}:{node.admin_port}", flush=True)
    print("ready", flush=True)
    node.wait_alive(stop_event)
    log.info("stopping")
    node.stop()
    log.info("stopped")
    return 0
