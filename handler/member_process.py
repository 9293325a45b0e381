"""The node's handle on its raft member process: the grouping handler's calls, carried over a channel.

`MemberProcess` has the calls of handler/service.py's GroupingHandler, which runs in the child
(handler/member.py; why a process: see there). Threads: any thread may call; none of the calls
blocks on raft except `status` (a round trip to the child, bounded by STATUS_TIMEOUT_MS; never
on the loop that reads the channel). The callbacks (on_applied, on_ready, a proposal's outcome)
run where the channel is read, in the order the child's raft member reported them: on the node's
engine loop once it runs (`loop`; until then, on the thread that starts the member), else on the
channel's reader thread. They must only hand work over (to the engine loop's bridge).
Rules:
- The child lives and dies with the node: it ends on ("stop",) or when the channel closes; the
  kernel kills it if the node dies (PR_SET_PDEATHSIG).
- If the child ends while the node runs, every proposal waiting for an outcome fails and `on_lost`
  is called once: the node cannot route groups without raft, so the runtime stops it for its
  supervisor to restart, as it does on any broken invariant.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import socket
import subprocess
import sys
import threading

from handler.member_channel import MemberChannel
from handler.member import CHANNEL_VERSION

log = logging.getLogger("grouper.handler")

START_TIMEOUT_MS = 60_000  # for the child to import pysyncobj, open its raft journal and bind its port
STATUS_TIMEOUT_MS = 2_000  # for the child to answer a status request
STOP_TIMEOUT_MS = 5_000  # for the child to stop its raft member before it is killed
LOST = "the raft member process ended"


def _with_result(on_result):
    """An outcome that a lost member reports without a result."""
    return lambda reason, result=None: on_result(reason, result)


class MemberProcess:
    def __init__(self, node_id: str, partners: list[str], raft_dir: str, *, on_applied, on_ready, on_lost,
                 loop=None, **settings):
        """`settings`: GroupingHandler's keyword settings (plain data), passed to it in the child as they are.
        `loop`: an asyncio loop not yet running (the node's engine loop), which then reads the channel
        and runs the callbacks; without it a thread of the channel's own does."""
        self.node_id = node_id
        self._on_applied = on_applied
        self._on_ready = on_ready
        self._on_lost = on_lost
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._outcomes: dict[int, object] = {}  # request id -> fn(reason or None)
        self._statuses: dict[int, list] = {}  # request id -> [event, status, error]
        self._started = threading.Event()
        self._start_failure: str | None = None
        self._stopping = False
        node_end, child_end = socket.socketpair()
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # holds the handler package
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH", "")]))
        try:
            self._process = subprocess.Popen([sys.executable, "-m", "handler.member", str(child_end.fileno()),
                                              str(os.getpid())],
                                             pass_fds=(child_end.fileno(),), env=env, stdin=subprocess.DEVNULL,
                                             umask=0o077)  # its raft journal and dump: 0600 in a 0700 dir
        finally:
            child_end.close()
        self._channel = MemberChannel(node_end, "raft-member", self._on_message, self._on_closed)
        self._loop = loop
        self._channel.send(("start", node_id, list(partners), raft_dir, settings, CHANNEL_VERSION))
        if loop is None:
            self._channel.start()
            self._started.wait(START_TIMEOUT_MS / 1000)
        elif self._channel.read_until(lambda message: self._started.is_set(), START_TIMEOUT_MS / 1000):
            self._channel.start_on(loop)
        if not self._started.is_set():
            self.stop()
            raise RuntimeError(f"the raft member process did not start within {START_TIMEOUT_MS} ms")
        if self._start_failure is not None:
            self.stop()
            raise RuntimeError(self._start_failure)
        log.info("raft member process %d started for %s", self._process.pid, node_id)

    @property
    def pid(self) -> int:
        return self._process.pid

    # ---- calls from the node (any thread; only status waits) ---------------------------------

    def claim(self, keys: list, now_ms: int, on_failed) -> None:
        """Propose routes for `keys`; decided ones arrive through on_applied; on_failed(keys, reason)."""
        self._request("claim", lambda reason: reason is not None and on_failed(keys, reason), keys, now_ms)

    def touch(self, entries: list, now_ms: int, on_failed) -> None:
        """Refresh routes this node relies on: [queue, group, node] each (see RouteTable.touch)."""
        self._request("touch", lambda reason: reason is not None and on_failed(entries, reason), entries, now_ms)

    def report_consumers(self, counts: dict, now_ms: int) -> None:
        self._channel.send(("report_consumers", counts, now_ms))

    def register(self, peer_address: str, amqp_address: str, admin_address: str, now_ms: int, on_done) -> None:
        self._request("register", on_done, peer_address, amqp_address, admin_address, now_ms)

    def move_clear(self, entries: list) -> None:
        """This node holds and sends nothing more of these moving groups toward their old owners."""
        self._channel.send(("move_clear", [list(entry) for entry in entries]))

    def unroute(self, keys: list) -> None:
        self._channel.send(("unroute", [list(key) for key in keys]))

    def drop_queue(self, queue: str) -> None:
        self._channel.send(("drop_queue", queue))

    def define_queue(self, values: dict, seed: bool, on_result) -> None:
        """on_result(reason or None, result): the command's result once applied (handler/queue_definitions.py)."""
        self._request("define_queue", _with_result(on_result), values, seed)

    def update_queue(self, name: str, changes: dict, on_result) -> None:
        self._request("update_queue", _with_result(on_result), name, changes)

    def delete_queue(self, name: str, seen_revision: int, on_result) -> None:
        self._request("delete_queue", _with_result(on_result), name, seen_revision)

    def replica_in_sync(self, backup: str, epoch: int, on_result) -> None:
        """This node, an owner at `epoch`, says `backup` is in sync (handler/replica_sets.py)."""
        self._request("replica_in_sync", _with_result(on_result), backup, epoch)

    def replica_out_of_sync(self, owner: str, backup: str, epoch: int, on_result) -> None:
        self._request("replica_out_of_sync", _with_result(on_result), owner, backup, epoch)

    def forget_node(self, node: str, on_result) -> None:
        """Forget `node`, removed from the raft cluster (handler/member_removal.py)."""
        self._request("forget_node", _with_result(on_result), node)

    def add_member(self, node: str, on_done) -> None:
        self._request("add_member", on_done, node)

    def remove_member(self, node: str, on_done) -> None:
        self._request("remove_member", on_done, node)

    def leader_contact(self, on_result) -> None:
        """on_result(reason or None, age_ms or None): how long ago the member last heard from the raft leader
        (handler/raft_status.py leader_contact_age_ms), for the owner's lease (issue 28)."""
        self._request("leader_contact", _with_result(on_result))

    def status(self) -> dict:
        if self._loop is not None and _running_loop() is self._loop:
            raise RuntimeError("the raft status was asked for on the loop that reads its answer: it would "
                               "wait for itself; ask from another thread")
        request_id = next(self._ids)
        slot = [threading.Event(), None, LOST]
        with self._lock:
            if self._stopping or not self._channel_open():
                raise TimeoutError(f"no raft status: {LOST}")
            self._statuses[request_id] = slot
        self._channel.send(("status", request_id))
        answered = slot[0].wait(STATUS_TIMEOUT_MS / 1000)
        with self._lock:
            self._statuses.pop(request_id, None)
        if not answered:
            raise TimeoutError(f"the raft member process did not answer a status request within "
                               f"{STATUS_TIMEOUT_MS} ms")
        if slot[1] is None:
            raise TimeoutError(f"no raft status: {slot[2]}")
        return slot[1]

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
        self._channel.send(("stop",))
        try:
            self._process.wait(STOP_TIMEOUT_MS / 1000)
        except subprocess.TimeoutExpired:
            log.warning("the raft member process %d did not stop within %d ms; killing it", self._process.pid,
                        STOP_TIMEOUT_MS)
            self._process.kill()
            self._process.wait()
        self._channel.close(flush_timeout_s=0)

    # ---- the child's messages (channel reader thread) ----------------------------------------

    def _request(self, kind: str, on_outcome, *args) -> None:
        request_id = next(self._ids)
        with self._lock:
            self._outcomes[request_id] = on_outcome
        self._channel.send((kind, request_id, *args))

    def _on_message(self, message) -> None:
        kind = message[0]
        if kind == "applied":
            self._on_applied(*message[1:])
        elif kind in ("done", "answer"):  # an answer carries the command's result too
            with self._lock:
                on_outcome = self._outcomes.pop(message[1], None)
            if on_outcome is not None:
                on_outcome(*message[2:])
        elif kind == "status":
            with self._lock:
                slot = self._statuses.get(message[1])
            if slot is not None:
                slot[1], slot[2] = message[2], message[3]
                slot[0].set()
        elif kind == "ready":
            self._on_ready()
        elif kind == "started":
            self._started.set()
        elif kind == "start_failed":
            self._start_failure = message[1]
            self._started.set()
        else:
            log.error("raft member process sent an unknown message %r; ignored", kind)

    def _on_closed(self, reason: str) -> None:
        with self._lock:
            stopping = self._stopping
            self._stopping = True
            outcomes, self._outcomes = self._outcomes, {}
            statuses = list(self._statuses.values())
        for slot in statuses:
            slot[0].set()
        if not self._started.is_set():
            self._start_failure = f"{LOST} while starting ({reason}); see its log lines above"
            self._started.set()
        for on_outcome in outcomes.values():
            on_outcome(LOST)
        if not stopping:
            exit_status = self._process.poll()
            self._on_lost(f"{LOST} ({reason}; exit status {exit_status})")

    def _channel_open(self) -> bool:
        return self._process.poll() is None


def _running_loop():
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
