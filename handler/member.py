"""The raft member process: one node's grouping handler, in a process of its own beside the node.

Why a process: pysyncobj's tick thread must answer heartbeats within the election timeout (at most
500 ms). Inside the node it shared one GIL with the engine loop, the journal writer and the gRPC
pools, and under load it went unscheduled long enough for the followers to elect a new leader with
nobody down. Here only raft runs, and the kernel schedules it against the node like any process.

`python -m handler.member FD NODE_PID`: FD is the child's end of a socketpair the node made (see
handler/member_channel.py for why that channel needs no further authentication). The first message is
("start", node_id, partners, raft_dir, settings, version), settings being GroupingHandler's keyword
settings and version the channel's CHANNEL_VERSION (absent: 1; one this member does not speak gets
("start_failed", reason) naming both, though node and member normally run from one tree);
then the node sends requests, and this process sends back what raft did:
    node -> member                                   member -> node
    ("claim", id, keys, now_ms)                      ("started",) or ("start_failed", reason)
    ("touch", id, entries, now_ms)                   ("ready",)
    ("report_consumers", counts, now_ms)             ("applied", kind, payload, at_ms)
    ("register", id, peer, amqp, admin, now_ms)      ("done", id, reason or None)
    ("unroute", keys)   ("drop_queue", queue)        ("status", id, status dict or None, error)
    ("add_member", id, node)  ("remove_member", id, node)
    ("define_queue", id, values, seed)               ("answer", id, reason or None, result)
    ("update_queue", id, name, changes)
    ("delete_queue", id, name, seen_revision)
    ("replica_in_sync", id, backup, epoch)  ("replica_out_of_sync", id, owner, backup, epoch)
    ("forget_node", id, node)
    ("status", id)   ("stop",)
    ("leader_contact", id): answered ("answer", id, None, age_ms or None), the owner's lease (issue 28)
Rules:
- Only the node ends this process: ("stop",), or the channel closing (the node died, even by
  SIGKILL). SIGINT, SIGTERM and SIGHUP sent to the node's process group are ignored here, so a
  Ctrl-C or a supervisor's SIGTERM stops the node, which then stops its member in order.
- It runs under the real-time round-robin policy when it may (else at a raised nice, else at the
  node's priority; it says which), so its heartbeats and decisions are not queued behind busy nodes
  (handler/member_priority.py).
- The raft secrets arrive over the channel, never on the command line (ps shows argv).
- Everything raft reports goes out in the order pysyncobj's tick thread reported it.
- It bounds its raft log by the route changes applied and gives back what the log held after each
  snapshot (handler/member_memory.py), and times the raft part of each route decision, which its
  status carries as "decision_latency" (handler/decision_timing.py).
- Never imports pysyncobj at the top: the node process imports this module (CHANNEL_VERSION);
  handler/service.py is imported once a start message arrives.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading

from handler.decision_timing import DecisionTiming
from handler.member_channel import MemberChannel
from handler.member_memory import LogBound, return_memory_after_snapshots
from handler.member_priority import die_with_parent, raise_priority, snapshot_child_at_low_priority
from node.core.cluster.feed import ROUTES

log = logging.getLogger("grouper.handler")

CHANNEL_VERSION = 1  # of the messages below; the node sends it in "start"
CHANNEL_VERSIONS_SPOKEN = (1,)


class Member:
    def __init__(self, channel_socket: socket.socket):
        self.handler = None
        self.stopped = threading.Event()
        self.channel = MemberChannel(channel_socket, "raft-member", self._on_message, self._on_closed)
        self._timing = DecisionTiming()
        self._log_bound = LogBound()  # pysyncobj's tick thread only
        self._requests = {
            "claim": self._claim, "touch": self._touch, "report_consumers": self._report_consumers,
            "register": self._register, "unroute": self._unroute, "drop_queue": self._drop_queue,
            "move_clear": self._move_clear,
            "define_queue": self._answered("define_queue"), "update_queue": self._answered("update_queue"),
            "delete_queue": self._answered("delete_queue"),
            "replica_in_sync": self._answered("replica_in_sync"),
            "replica_out_of_sync": self._answered("replica_out_of_sync"),
            "forget_node": self._answered("forget_node"),
            "add_member": self._add_member, "remove_member": self._remove_member,
            "status": self._status, "stop": self._stop, "leader_contact": self._leader_contact,
        }

    # ---- the node's messages (channel reader thread) -----------------------------------------

    def _on_message(self, message) -> None:
        if message[0] == "start":
            self._start(*message[1:])
        elif self.handler is None:
            log.error("raft member: %r before start; ignored", message[0])
        else:
            self._requests[message[0]](*message[1:])

    def _on_closed(self, reason: str) -> None:
        if not self.stopped.is_set():
            log.warning("raft member: the node's channel closed (%s); stopping", reason)
            logging.shutdown()
            os._exit(1)  # the node is gone or this member broke: nobody would hear what it decides

    def _start(self, node_id: str, partners: list[str], raft_dir: str, settings: dict,
               version: int = 1) -> None:
        send = self.channel.send
        if version not in CHANNEL_VERSIONS_SPOKEN:
            send(("start_failed", f"the node speaks raft member channel version {version!r}, this member "
                                  f"(python -m handler.member from {os.path.dirname(os.path.dirname(__file__))}) "
                                  f"speaks {CHANNEL_VERSIONS_SPOKEN}: run node and member from one install"))
            return
        try:
            from handler.service import GroupingHandler  # here: the node process never imports pysyncobj
            self.handler = GroupingHandler(
                node_id, partners, raft_dir,
                on_applied=lambda kind, payload, at_ms: self._applied(kind, payload, at_ms),
                on_ready=lambda: send(("ready",)), **settings)
        except Exception as error:  # reported to the node, which says what to fix
            send(("start_failed", f"{type(error).__name__}: {error}"))
            return
        send(("started",))
        threading.Thread(target=return_memory_after_snapshots, args=(raft_dir, self.stopped),
                         name="memory-return", daemon=True).start()

    def _claim(self, request_id, keys, now_ms) -> None:
        self._timing.claimed(keys)
        self.handler.claim(keys, now_ms, on_failed=lambda _keys, reason: self._claim_failed(request_id, keys, reason),
                           on_committed=lambda: self._done(request_id, None))

    def _claim_failed(self, request_id, keys, reason) -> None:
        self._timing.failed(keys)
        self._done(request_id, reason)

    def _applied(self, kind, payload, at_ms) -> None:  # pysyncobj's tick thread
        # (the handler is None while pysyncobj replays its journal inside the handler's constructor)
        if kind == ROUTES and self._log_bound.applied(len(payload)) and self.handler is not None:
            self._log_bound.asked()
            self.handler.compact_log()
        self._timing.applied(kind, payload)
        self.channel.send(("applied", kind, payload, at_ms))

    def _touch(self, request_id, entries, now_ms) -> None:
        self.handler.touch(entries, now_ms, on_failed=lambda _entries, reason: self._done(request_id, reason),
                           on_committed=lambda: self._done(request_id, None))

    def _report_consumers(self, counts, now_ms) -> None:
        self.handler.report_consumers(counts, now_ms)

    def _register(self, request_id, peer_address, amqp_address, admin_address, now_ms) -> None:
        self.handler.register(peer_address, amqp_address, admin_address, now_ms,
                              on_done=lambda reason: self._done(request_id, reason))

    def _move_clear(self, entries) -> None:
        self.handler.move_clear(entries)

    def _unroute(self, keys) -> None:
        self.handler.unroute(keys)

    def _drop_queue(self, queue) -> None:
        self.handler.drop_queue(queue)

    def _answered(self, name: str):
        """A request whose command's result goes back to the node: ("answer", id, reason, result)."""
        def request(request_id, *args) -> None:
            getattr(self.handler, name)(*args, on_result=lambda reason, result: self.channel.send(
                ("answer", request_id, reason, result)))
        return request

    def _add_member(self, request_id, node) -> None:
        self.handler.add_member(node, on_done=lambda reason: self._done(request_id, reason))

    def _remove_member(self, request_id, node) -> None:
        self.handler.remove_member(node, on_done=lambda reason: self._done(request_id, reason))

    def _status(self, request_id) -> None:
        try:
            status = self.handler.status()
            status["decision_latency"] = self._timing.snapshot()
            self.channel.send(("status", request_id, status, None))
        except TimeoutError as error:
            self.channel.send(("status", request_id, None, str(error)))

    def _leader_contact(self, request_id) -> None:
        self.channel.send(("answer", request_id, None, self.handler.leader_contact_age_ms()))

    def _stop(self) -> None:
        self.stopped.set()

    def _done(self, request_id, reason) -> None:
        self.channel.send(("done", request_id, reason))

    # ---- lifecycle (main thread) -------------------------------------------------------------

    def run(self) -> int:
        self.channel.start()
        self.stopped.wait()
        if self.handler is not None:
            self.handler.stop()
        self.channel.close()
        return 0


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    die_with_parent()
    scheduling = raise_priority()
    os.register_at_fork(after_in_child=snapshot_child_at_low_priority)
    if os.getppid() != int(argv[1]):
        return 0  # the node died before this process could ask to die with it (in a container the
        # node is often PID 1, so its death shows as another parent, not as PID 1)
    log.info("raft member process %d runs at %s", os.getpid(), scheduling)
    channel_socket = socket.socket(fileno=int(argv[0]))
    return Member(channel_socket).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
