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
    ("status", id)   ("stop",)
Rules:
- Only the node ends this process: ("stop",), or the channel closing (the node died, even by
  SIGKILL). SIGINT, SIGTERM and SIGHUP sent to the node's process group are ignored here, so a
  Ctrl-C or a supervisor's SIGTERM stops the node, which then stops its member in order.
- It runs under the real-time round-robin policy when it may (else at nice MEMBER_NICE, else at the
  node's priority; it says which), so its heartbeats and decisions are not queued behind busy nodes.
- The raft secrets arrive over the channel, never on the command line (ps shows argv).
- Everything raft reports goes out in the order pysyncobj's tick thread reported it.
- After pysyncobj compacts its log into a snapshot (raft.dump replaced), the member gives back what the
  log held: the freed heap (glibc's malloc_trim; free() keeps it otherwise) and the pages of the raft
  journal file's mapping (pysyncobj mmaps it and reuses it from the start after a compaction, so its
  pages from before stay in the resident set). A million routes claimed a thousand to a command left
  ~50 bytes a route in each (bench/route_memory.py, "member"); see `return_freed_memory`. pysyncobj
  compacts only past 5,000 entries or 300 s, and a claim entry carries up to a thousand routes, so
  the member asks for a compaction itself once LOG_ROUTES_BEFORE_COMPACTION route changes were
  applied since it last asked: the log then holds at most ~100 bytes (heap and mapping) times that.
- It times the raft part of each route decision, from a claim's arrival here to its route being applied
  here, and adds that tally to its status ("decision_latency"): the node times the whole decision from its
  own engine loop, which also counts the waits of a busy node's loop; the difference says which side
  a slow decision spent its time on.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import sys
import threading
import time

from handler.member_channel import MemberChannel
from node.core.cluster.feed import ROUTES, SNAPSHOT
from node.core.tally import DECISION_BOUNDS_MS, LatencyTally

log = logging.getLogger("grouper.handler")

CHANNEL_VERSION = 1  # of the messages below; the node sends it in "start"
CHANNEL_VERSIONS_SPOKEN = (1,)

PR_SET_PDEATHSIG = 1  # prctl(2): a signal for this process when its parent dies
# Scheduling. When the nodes (and their neighbours) keep every core busy, a member at the nodes'
# priority waits its turn on each wake-up, and a decision takes ~8 wake-ups across three members: at
# 3,000 msgs/s through 3 nodes on 2 cores, nice -10 still left the member part of a decision at
# 21 ms p99 (each wake-up waited ~0.5 ms on average), SCHED_RR at 2.2 ms. A real-time thread runs as
# soon as it wakes; the member uses little CPU (a few % at that load), and the kernel keeps 5% of
# every core for other work whatever real-time threads do (sched_rt_runtime_us). Both need
# CAP_SYS_NICE (a node run as root has it; a container usually does not)
CLAIMS_TIMED_MAX = 100_000  # claims timed at once; the rest pass untimed (a leaderless cluster piles them up)
MEMBER_RT_PRIORITY = 1  # SCHED_RR, the lowest real-time priority: above every normal thread, below the kernel's
MEMBER_NICE = -10  # the fallback without a real-time policy
SNAPSHOT_CHILD_NICE = 10  # pysyncobj's forked snapshot writer: below the nodes, it is never urgent
# route changes applied (claimed, refreshed, moved, removed) after which the member asks pysyncobj to compact
# its log: ~20 MB of log at ~100 bytes a change; a compaction pickles the table in a forked child (a
# million routes: ~3 s of its CPU at nice 10), so at most one per this many changes
LOG_ROUTES_BEFORE_COMPACTION = 200_000
SNAPSHOT_CHECK_S = 2.0  # how often the member looks for a new raft snapshot, after which it returns memory
RAFT_JOURNAL_FILE = "raft.journal"  # in raft_dir; handler/service.py names pysyncobj's files so
RAFT_DUMP_FILE = "raft.dump"
MADV_DONTNEED = 4  # madvise(2), Linux: on a shared file mapping it only unmaps pages; the file keeps the data


class Member:
    def __init__(self, channel_socket: socket.socket):
        self.handler = None
        self.stopped = threading.Event()
        self.channel = MemberChannel(channel_socket, "raft-member", self._on_message, self._on_closed)
        # (queue, group) -> when its claim arrived (monotonic ns); set on the channel's reader thread,
        # taken on pysyncobj's tick thread, so both sides hold the lock, as does a status snapshot
        self._claimed_ns: dict[tuple, int] = {}
        self._decision_latency = LatencyTally(DECISION_BOUNDS_MS)
        self._routes_since_compaction = 0  # pysyncobj's tick thread only
        self._timing = threading.Lock()
        self._requests = {
            "claim": self._claim, "touch": self._touch, "report_consumers": self._report_consumers,
            "register": self._register, "unroute": self._unroute, "drop_queue": self._drop_queue,
            "move_clear": self._move_clear,
            "define_queue": self._answered("define_queue"), "update_queue": self._answered("update_queue"),
            "delete_queue": self._answered("delete_queue"),
            "add_member": self._add_member, "remove_member": self._remove_member,
            "status": self._status, "stop": self._stop,
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
        threading.Thread(target=self._return_memory_after_snapshots, args=(raft_dir,), name="memory-return",
                         daemon=True).start()

    def _claim(self, request_id, keys, now_ms) -> None:
        claimed_ns = time.monotonic_ns()
        with self._timing:
            if len(self._claimed_ns) < CLAIMS_TIMED_MAX:
                for queue, group in keys:
                    self._claimed_ns.setdefault((queue, group), claimed_ns)
        self.handler.claim(keys, now_ms, on_failed=lambda _keys, reason: self._claim_failed(request_id, keys, reason),
                           on_committed=lambda: self._done(request_id, None))

    def _claim_failed(self, request_id, keys, reason) -> None:
        with self._timing:
            for queue, group in keys:
                self._claimed_ns.pop((queue, group), None)
        self._done(request_id, reason)

    def _applied(self, kind, payload, at_ms) -> None:  # pysyncobj's tick thread
        if kind == ROUTES:
            self._routes_since_compaction += len(payload)
            # (the handler is None while pysyncobj replays its journal inside the handler's constructor)
            if self._routes_since_compaction >= LOG_ROUTES_BEFORE_COMPACTION and self.handler is not None:
                self._routes_since_compaction = 0
                self.handler.compact_log()
        if kind == ROUTES and self._claimed_ns:
            applied_ns = time.monotonic_ns()
            with self._timing:
                claimed_ns, tally = self._claimed_ns, self._decision_latency
                for entry in payload:
                    since_ns = claimed_ns.pop((entry[0], entry[1]), None)
                    if since_ns is not None and entry[2] is not None:
                        tally.observe((applied_ns - since_ns) / 1e6)
        elif kind == SNAPSHOT:
            with self._timing:
                self._claimed_ns.clear()  # caught up on by a snapshot: no decision of theirs is seen here
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
            with self._timing:
                status["decision_latency"] = self._decision_latency.snapshot()
            self.channel.send(("status", request_id, status, None))
        except TimeoutError as error:
            self.channel.send(("status", request_id, None, str(error)))

    def _stop(self) -> None:
        self.stopped.set()

    def _return_memory_after_snapshots(self, raft_dir: str) -> None:
        """Own thread: once a new snapshot has been seen for one check (pysyncobj drops the compacted log
        entries on its next tick after the dump is written), return what they held."""
        dump = os.path.join(raft_dir, RAFT_DUMP_FILE)
        journal = os.path.realpath(os.path.join(raft_dir, RAFT_JOURNAL_FILE))
        seen, pending = _modified_ns(dump), False
        while not self.stopped.wait(SNAPSHOT_CHECK_S):
            if pending:
                pending = False
                returned = return_freed_memory(journal)
                log.info("raft member: log compacted into a snapshot; %s", returned)
            modified = _modified_ns(dump)
            if modified != seen:
                seen, pending = modified, True

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


def _modified_ns(path: str) -> int | None:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return None


def return_freed_memory(mapped_path: str) -> str:
    """Give the kernel back the heap glibc holds free (malloc_trim) and unmap the resident pages of every
    mapping of `mapped_path` (MADV_DONTNEED: a shared file mapping faults them back from the page cache
    when next touched, so nothing is lost). Returns what it did, for the log; never raises."""
    done = []
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError as error:
        return f"no C library to call ({error})"
    try:
        libc.malloc_trim(0)
        done.append("malloc_trim")
    except AttributeError:
        done.append("no malloc_trim (not glibc)")
    try:
        with open("/proc/self/maps") as maps:
            ranges = [line.split()[0] for line in maps if line.rstrip("\n").endswith(" " + mapped_path)]
    except OSError as error:
        return f"{', '.join(done)}; /proc/self/maps unreadable ({error})"
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    unmapped = 0
    for address_range in ranges:
        start, end = (int(part, 16) for part in address_range.split("-"))
        if libc.madvise(start, end - start, MADV_DONTNEED) == 0:
            unmapped += end - start
    done.append(f"{unmapped >> 20} MiB of {os.path.basename(mapped_path)}'s mapping released")
    return ", ".join(done)


def _die_with_parent() -> None:
    # belt and braces beside the channel's EOF: the kernel kills this process when the node's dies
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the channel's EOF alone ends this process


def _raise_priority() -> str:
    """Before any thread starts (threads inherit it); returns what it got, for the log."""
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(MEMBER_RT_PRIORITY))
        return f"real-time (SCHED_RR {MEMBER_RT_PRIORITY})"
    except (OSError, AttributeError) as error:
        refusal = getattr(error, "strerror", None) or str(error)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, MEMBER_NICE)
        return f"nice {MEMBER_NICE} (real-time scheduling refused: {refusal})"
    except OSError as error:
        # the usual case for a non-root node (a container): said once, not a fault
        return (f"the node's priority (real-time scheduling and nice {MEMBER_NICE} need CAP_SYS_NICE: "
                f"{error.strerror}); on a host whose cores the nodes keep busy, decisions slow down and the "
                f"raft leadership may move")


def _snapshot_child_at_low_priority() -> None:
    # pysyncobj forks to write a raft snapshot (handler/service.py); at the member's real-time priority
    # that child would keep a core from the nodes for the seconds a large table takes to pickle
    try:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        os.setpriority(os.PRIO_PROCESS, 0, SNAPSHOT_CHILD_NICE)  # a lower priority needs no privilege
    except (OSError, AttributeError):
        pass  # not Linux: the child runs at the member's priority


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    _die_with_parent()
    scheduling = _raise_priority()
    os.register_at_fork(after_in_child=_snapshot_child_at_low_priority)
    if os.getppid() != int(argv[1]):
        return 0  # the node died before this process could ask to die with it (in a container the
        # node is often PID 1, so its death shows as another parent, not as PID 1)
    log.info("raft member process %d runs at %s", os.getpid(), scheduling)
    channel_socket = socket.socket(fileno=int(argv[0]))
    return Member(channel_socket).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
