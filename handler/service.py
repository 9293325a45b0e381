"""The grouping handler of one node: its raft member, the calls the node makes, and the leader's duties.

It runs in the node's raft member process (handler/member.py), never in the node itself, which
reaches it through handler/member_process.py. Threads: pysyncobj's tick thread owns the replica and
runs every callback; callers on other threads (the member's channel reader, the duties thread) only
enqueue commands, which never blocks, and hear back through the callbacks they pass, on the tick
thread. The raft leader is the LOCAL handler: every proposal is decided in log order there; the
other members forward theirs to it (pysyncobj does). The leader also has duties, decided by
handler/leader_duties.py (the reaper and owner failover); a thread of this class only feeds it the
clock and the raft status and enqueues the commands it returns.

The leader walks a diverged follower's log back by handler/raft_catch_up.py's rule (pysyncobj's own
could send it forward again at every tick and leave it behind for good). Raft connections go through
handler/raft_transport.py: the dialer names the member it meant to reach, and a node closes a
connection meant for another (a stale address, an IP reused after a restart), so the dialer redials
and resolves the name again. With `raft_secrets` every raft
connection is encrypted and authenticated with them (pysyncobj's password; see the transport).
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time

from pysyncobj import FAIL_REASON, SyncObjConf
from pysyncobj.monotonic import monotonic as raft_clock

from handler.leader_duties import ExpireIdle, FailOver, FollowConsumers, LeaderDuties, MarkUp, RaftStatus
from handler.raft_catch_up import CatchUpSyncObj
from handler.raft_transport import RaftTransport
from handler.replicated import PYSYNCOBJ_LOGGER, RefuseNewerCommands, RouteTableReplica
from handler.placement import PLACEMENT_BALANCED

log = logging.getLogger("grouper.handler")

DUTIES_INTERVAL_MS = 200  # how often the leader checks members' reachability (owner failover)
DESTROY_WAIT_S = 2.0  # how long stop() waits for the tick thread
STATUS_TRIES = 5  # reads of state the tick thread is changing (the raft status, the table) before giving up
# a follower whose connection to the leader closed (its process died: the kernel closes its sockets)
# elects after a random wait in this range instead of its election timeout (200-500 ms by default);
# the randomness keeps two followers from splitting the vote, the floor lets a mere reconnect win
LEADER_LOST_ELECTION_MS = (40, 140)
# the raft code version of the commands moves need (handler/replicated.py's ver=1 commands): pysyncobj
# proposes them only once a setCodeVersion entry in the log enabled it (and forgets it when a restart
# loads a compacted log), so a member proposes that entry the first time it would propose one of
# them, and drops that proposal (the leader's duties and the node propose again later). Every member
# must run this code by then (route_follow_ms on all)
MOVES_CODE_VERSION = 1
# the raft code version of the queue definition commands (ver=2 in handler/replicated.py), enabled the
# same way; a definition proposed before it is enabled waits for that entry, then goes (an admin waits)
QUEUES_CODE_VERSION = 2


class GroupingHandler:
    def __init__(self, node_id: str, partners: list[str], raft_dir: str, *, on_applied, on_ready,
                 election_timeout_min_ms: int, election_timeout_max_ms: int, routes_max: int,
                 group_timeout_ms: int = 0, owner_failover_ms: int = 0, route_follow_ms: int = 0,
                 placement: str = PLACEMENT_BALANCED, bind_host: str = "", raft_secrets: tuple[str, ...] = ()):
        os.makedirs(raft_dir, exist_ok=True)
        self.node_id = node_id
        self.placement = placement  # goes into every claim: replicas place by the proposer's mode, never their own
        self.group_timeout_ms = group_timeout_ms
        self.owner_failover_ms = owner_failover_ms
        self._on_ready = on_ready
        self._election_timeout_ms = (election_timeout_min_ms, election_timeout_max_ms)
        self._had_leader = False  # tick thread: a leader was known once (an election after that is news)
        self._followed_leader: str | None = None  # tick thread: the last leader this member knew of
        self.replica = RouteTableReplica(on_applied, routes_max)
        # see handler/replicated.py; removed again by stop(), as the logger outlives this handler
        self._refuse_newer = RefuseNewerCommands()
        logging.getLogger(PYSYNCOBJ_LOGGER).addHandler(self._refuse_newer)
        conf = SyncObjConf(
            appendEntriesUseBatch=False,  # a follower's proposal waits ~200 ms for a batch otherwise
            raftMinTimeout=election_timeout_min_ms / 1000,
            raftMaxTimeout=election_timeout_max_ms / 1000,
            appendEntriesPeriod=min(0.05, election_timeout_min_ms / 4000),
            connectionRetryTime=0.2,  # reconnect to a restarted member fast
            # names are resolved again on each reconnect after this long: a restarted pod comes back
            # with a new IP (pysyncobj's default 600 s kept dialling the old one for minutes), and a
            # peer starting a moment after this one must not be written off for 30 s. A pod that took
            # the old IP closes the connection (RaftTransport), so the dialer does reconnect
            dnsCacheTime=1.0,
            dnsFailCacheTime=1.0,
            journalFile=os.path.join(raft_dir, "raft.journal"),
            fullDumpFile=os.path.join(raft_dir, "raft.dump"),  # journal alone loses state after compaction
            # A snapshot is pickled and gzipped (level 9) in a forked child. In this thread it stopped the
            # heartbeats for as long as that takes: 3 s and more with a million routes (12 s measured at
            # load average 17 on the 2-core machine, bench/route_memory.py's state), far past the election
            # timeout, and the pickler's memo raised the member's resident set by ~70 MB. The member
            # process runs only raft and its channel (the node, with gRPC and proton, never forks); the
            # child only writes the dump and exits, at low priority (handler/member.py: SNAPSHOT_CHILD_NICE)
            useFork=True,
            dynamicMembershipChange=True,
            onReady=self._ready,
            onStateChanged=self._state_changed,
            bindAddress=f"{bind_host}:{node_id.rsplit(':', 1)[1]}" if bind_host else None,
            # turns on pysyncobj's key exchange; the transport encrypts with every secret given
            password=raft_secrets[0] if raft_secrets else None,
        )
        self._syncobj = CatchUpSyncObj(node_id, list(partners), conf=conf, consumers=[self.replica],
                                transportClass=RaftTransport.with_secrets(raft_secrets) if raft_secrets
                                else RaftTransport)
        self._syncobj._SyncObj__transport.on_member_lost = self._member_lost  # pysyncobj keeps it private
        self._syncobj.addOnTickCallback(self._note_leader)
        # pysyncobj rewrites its meta file once a second just to keep the commit index, which raft keeps
        # in memory only (a restarted member learns it from the leader's next heartbeat): the write
        # replaces the file by a rename, and ext4 makes a rename over a file wait for the new file's
        # data to reach the disk, so under the node's journal load it stalled this tick thread for
        # 100+ ms at a time (0.43 s of one 10 s profile) and heartbeats with it. The term and vote are
        # still written at once on every change, as raft requires.
        self._syncobj._SyncObj__raftLog.onOneSecondTimer = lambda: None
        self.duties = LeaderDuties(group_timeout_ms, owner_failover_ms, route_follow_ms=route_follow_ms)
        self._code_version_proposed = False
        self._stopped = threading.Event()
        self._duties = None
        if self.duties.active:
            self._duties = threading.Thread(target=self._leader_duties, name="leader-duties", daemon=True)
            self._duties.start()

    # ---- calls from the node (any thread; none blocks) ---------------------------------------

    def claim(self, keys: list, now_ms: int, on_failed, on_committed=None) -> None:
        """Propose routes for `keys`; decided ones arrive through on_applied; on_failed(keys, reason),
        else on_committed() once the proposal is in the log."""
        self.replica.claim([list(key) for key in keys], self.node_id, now_ms, self.placement,
                           callback=self._callback(lambda reason: on_failed(keys, reason), on_committed))

    def touch(self, entries: list, now_ms: int, on_failed, on_committed=None) -> None:
        """Refresh routes this node relies on: [queue, group, node] each (see RouteTable.touch)."""
        self.replica.touch([list(entry) for entry in entries], now_ms,
                           callback=self._callback(lambda reason: on_failed(entries, reason), on_committed))

    def report_consumers(self, counts: dict, now_ms: int) -> None:
        self.replica.report_consumers(self.node_id, counts, now_ms, callback=self._logged("report_consumers"))

    def register(self, peer_address: str, amqp_address: str, admin_address: str, now_ms: int, on_done) -> None:
        self.replica.register_node(self.node_id, peer_address, amqp_address, admin_address, now_ms,
                                   callback=self._callback(on_done, on_success=lambda: on_done(None)))

    def move_clear(self, entries: list) -> None:
        """This node holds and sends nothing more of these moving groups toward their old owners: entries
        are [queue, group, from_node, to_node] (see RouteTable.move_clear); a lost one is proposed again."""
        if self._moves_enabled():
            self.replica.move_clear([list(entry) for entry in entries], self.node_id,
                                    callback=self._logged("move_clear"))

    def unroute(self, keys: list) -> None:
        self.replica.unroute([list(key) for key in keys], callback=self._logged("unroute"))

    def drop_queue(self, queue: str) -> None:
        self.replica.drop_queue(queue, callback=self._logged("drop_queue"))

    def define_queue(self, values: dict, seed: bool, on_result) -> None:
        """Propose a queue definition (handler/queue_definitions.py); on_result(reason, result): reason
        None once applied, with the command's result [outcome, definition]."""
        self._with_queues_enabled(on_result, lambda callback: self.replica.define_queue(
            values, seed, callback=callback))

    def update_queue(self, name: str, changes: dict, on_result) -> None:
        self._with_queues_enabled(on_result, lambda callback: self.replica.update_queue(
            name, changes, callback=callback))

    def delete_queue(self, name: str, seen_revision: int, on_result) -> None:
        self._with_queues_enabled(on_result, lambda callback: self.replica.delete_queue(
            name, seen_revision, callback=callback))

    def _with_queues_enabled(self, on_result, propose) -> None:
        def callback(result, error):
            on_result(None if error == FAIL_REASON.SUCCESS else _REASONS.get(error, f"raft error {error}"), result)
        if self._code_version_usable(QUEUES_CODE_VERSION, "define_queue"):
            propose(callback)
            return

        def enabled(_result, error):  # tick thread; proposing from here only enqueues
            if error != FAIL_REASON.SUCCESS:
                on_result(f"enabling raft code version {QUEUES_CODE_VERSION} failed: "
                          f"{_REASONS.get(error, f'raft error {error}')}", None)
            else:
                propose(callback)
        version = self._version_to_enable(QUEUES_CODE_VERSION)
        log.info("enabling raft code version %d (cluster-wide queue definitions)", version)
        self._syncobj.setCodeVersion(version, callback=enabled)

    def add_member(self, node: str, on_done) -> None:
        self._syncobj.addNodeToCluster(node, callback=self._callback(on_done, on_success=lambda: on_done(None)))

    def remove_member(self, node: str, on_done) -> None:
        self._syncobj.removeNodeFromCluster(node, callback=self._callback(on_done, on_success=lambda: on_done(None)))

    def compact_log(self) -> None:
        """Compact the raft log into a snapshot at pysyncobj's next chance, whatever its own thresholds
        (handler/member.py bounds the log's memory by the route changes it carries)."""
        self._syncobj.forceLogCompaction()

    # ---- state -------------------------------------------------------------------------------

    def status(self) -> dict:
        raw = _read_while_applying(self._syncobj.getStatus, "the raft status")
        leader = raw.get("leader")
        partners = sorted(key[len("partner_node_status_server_"):] for key in raw
                          if key.startswith("partner_node_status_server_"))
        return {
            "node": self.node_id,
            "state": ("follower", "candidate", "leader")[raw["state"]] if raw["state"] in (0, 1, 2) else str(raw["state"]),
            "leader": str(leader.id) if leader is not None else "",
            "term": int(raw["raft_term"]),
            "has_quorum": bool(raw["has_quorum"]),
            "members": sorted([self.node_id, *partners]),
            "connected": sorted(p for p in partners if raw[f"partner_node_status_server_{p}"] == 2),
            "commit_index": int(raw["commit_idx"]),
            "last_applied": int(raw["last_applied"]),
            "ready": self._syncobj.isReady(),
        }

    def stop(self) -> None:
        self._stopped.set()
        self._syncobj.destroy()
        logging.getLogger(PYSYNCOBJ_LOGGER).removeHandler(self._refuse_newer)
        if self._duties is not None:
            self._duties.join(DESTROY_WAIT_S)

    # ---- internals (tick thread) -------------------------------------------------------------

    def _ready(self):
        self._had_leader = True
        log.info("grouping handler ready: replica caught up with the raft log")
        self._on_ready()

    def _state_changed(self, old_state, new_state):
        if new_state == 1 and old_state == 0:  # a follower's election timeout fired: say what it saw
            transport = self._syncobj._SyncObj__transport  # pysyncobj keeps it private; ours is a RaftTransport
            # a member that never had a leader (a cluster forming) elects as a matter of course
            log.log(logging.WARNING if self._had_leader else logging.INFO,
                    "raft election started by this member: its leader's connection closed, or no message "
                    "came from a leader within the election timeout (%d-%d ms); %s",
                    self._election_timeout_ms[0], self._election_timeout_ms[1],
                    transport.pulse(time.monotonic()))
        if new_state == 2:
            self._had_leader = True
            log.info("this node is now the raft leader: the LOCAL grouping handler")

    def _note_leader(self):  # tick thread, after every tick
        leader = self._syncobj._getLeader()
        if leader is not None:
            self._followed_leader = str(leader.id)

    def _member_lost(self, node):
        leader = self._syncobj._getLeader()
        if not lost_leader(self._syncobj._isLeader(), str(leader.id) if leader is not None else None,
                           self._followed_leader, str(node.id)):
            return
        wait_ms = random.uniform(*LEADER_LOST_ELECTION_MS)
        # pysyncobj keeps the deadline private, on its own clock (not time.monotonic: they differ by a
        # constant here); earlier only, so a vote already due is not put off
        deadline_s = raft_clock() + wait_ms / 1000
        if deadline_s < self._syncobj._SyncObj__raftElectionDeadline:
            self._syncobj._SyncObj__raftElectionDeadline = deadline_s
            log.info("raft leader %s closed its connection: electing a new one in %.0f ms unless it is back",
                     node.id, wait_ms)

    def _callback(self, on_failed, on_success=None):
        def done(result, error):
            if error == FAIL_REASON.SUCCESS:
                if on_success is not None:
                    on_success()
            else:
                on_failed(_REASONS.get(error, f"raft error {error}"))
        return done

    def _logged(self, what):
        return self._callback(lambda reason: log.warning("grouping handler: %s failed: %s", what, reason))

    def _leader_duties(self):
        # this thread only supplies the clock and the raft status and proposes what the pure duties
        # return (handler/leader_duties.py); every decision is in the log
        while not self._stopped.wait(DUTIES_INTERVAL_MS / 1000):
            try:
                status = self._duties_status()
            except TimeoutError as error:
                log.warning("leader duties skipped a round: %s", error)
                continue
            for command in self.duties.tick(int(time.time() * 1000), status):
                self._propose_duty(command)

    def _duties_status(self) -> RaftStatus:
        if not self._syncobj._isLeader():
            return RaftStatus(leader=False, term=0, reachable=(), unreachable=())
        status = self.status()
        others = [member for member in status["members"] if member != self.node_id]
        return RaftStatus(
            leader=status["state"] == "leader", term=status["term"],
            reachable=tuple(member for member in others if member in status["connected"]),
            unreachable=tuple(member for member in others if member not in status["connected"]),
            down=frozenset(self.replica.table.down),  # a read-only look; decisions go through the log
            **(self._placement() if self.duties.route_follow_ms else {}))

    def _moves_enabled(self) -> bool:
        if self._code_version_usable(MOVES_CODE_VERSION, "move_clear"):
            return True
        if not self._code_version_proposed:
            self._code_version_proposed = True
            version = self._version_to_enable(MOVES_CODE_VERSION)
            log.info("enabling raft code version %d (groups follow their consumers)", version)

            def failed(reason):
                self._code_version_proposed = False
                log.warning("grouping handler: enabling raft code version %d failed: %s; retrying",
                            version, reason)
            self._syncobj.setCodeVersion(version, callback=self._callback(failed))
        return False

    def _version_to_enable(self, version: int) -> int:
        """The code version to propose for commands of `version`: the one enabled already when it is
        newer. pysyncobj refuses (raises, which ended the member) a version below the enabled one, and
        after a snapshot load a member must enable its commands again (_code_version_usable): with
        queue definitions (2) enabled, moves (1) asked for 1 (nemesis follow campaigns, 2026-11-24)."""
        return max(version, self._syncobj.getCodeVersion())

    def _code_version_usable(self, version: int, command: str) -> bool:
        """This member can propose `command`, a replicated command of raft code version `version`.

        Enabled is not enough: loading a snapshot (a restart after log compaction) keeps pysyncobj's
        enabled code version but sets its command names back to version 0 (__loadDumpFile calls
        __onSetCodeVersion(0)), and a proposal of a newer command then raises KeyError in pysyncobj's
        wrapper, which ended the member at every start (found by the nemesis campaign, run E round 25).
        The callers then propose setCodeVersion again, as for a version never enabled: an entry of
        the same version is allowed, and applying it sets the names again."""
        if self._syncobj.getCodeVersion() < version:
            return False
        try:  # pysyncobj's own wrapper resolves a proposal's name this way
            self._syncobj._getFuncName((id(self.replica), command))
        except KeyError:
            return False
        return True

    def _placement(self) -> dict:
        """The table's consumers and routes per node and queue, for following consumers: a read-only
        look from this thread while the tick thread applies commands."""
        table = self.replica.table
        return _read_while_applying(lambda: {
            "consumers": tuple((node, queue, count) for node, held in sorted(dict(table.consumers).items())
                               for queue, count in sorted(dict(held).items())),
            "routed": tuple((node, queue, count) for (node, queue), count in sorted(dict(table.route_counts).items())),
        }, "the route table")

    def _propose_duty(self, command) -> None:
        if isinstance(command, ExpireIdle):
            self.replica.expire_idle(command.cutoff_ms, list(command.spared_nodes),
                                     callback=self._logged("expire_idle"))
        elif isinstance(command, FailOver):
            log.warning("OWNER FAILOVER: member %s unreachable for %d ms (owner_failover_ms=%d): marking it "
                        "down and moving its groups to live nodes; messages it still holds for them may be "
                        "processed out of order if it returns", command.node, command.unreachable_ms,
                        self.owner_failover_ms)
            self.replica.fail_over(command.node, command.now_ms, callback=self._logged("fail_over"))
        elif isinstance(command, FollowConsumers):
            if not self._moves_enabled():
                return  # the duties propose it again a route_follow_ms later
            log.info("groups of queue %r follow their consumers away from %s (no consumer there for %d ms, "
                     "route_follow_ms)", command.queue, command.from_node, self.duties.route_follow_ms)
            self.replica.follow_consumers(command.queue, command.from_node, command.now_ms,
                                          callback=self._logged("follow_consumers"))
        elif isinstance(command, MarkUp):
            log.warning("member %s is reachable again: marking it up; groups moved away while it was "
                        "down stay where they are now", command.node)
            self.replica.mark_up(command.node, command.now_ms, callback=self._logged("mark_up"))
        else:
            raise AssertionError(f"leader duties returned an unknown command {command!r}")


def _read_while_applying(read, what: str):
    """read() state the tick thread may change meanwhile: a read that meets a dict changing size is
    tried again, up to STATUS_TRIES times."""
    for _ in range(STATUS_TRIES):
        try:
            return read()
        except RuntimeError:
            continue
    raise TimeoutError(f"{what} kept changing while being read; try again")


_REASONS = {
    FAIL_REASON.QUEUE_FULL: "the raft command queue is full",
    FAIL_REASON.MISSING_LEADER: "the raft cluster has no leader (is a majority of nodes up?)",
    FAIL_REASON.DISCARDED: "the proposal was discarded by a leader change",
    FAIL_REASON.NOT_LEADER: "the proposal reached a node that is no longer the leader",
    FAIL_REASON.LEADER_CHANGED: "the raft leader changed while the proposal was in flight",
    FAIL_REASON.REQUEST_DENIED: "the raft cluster denied the request",
    FAIL_REASON.UNKNOWN_OUTCOME: "the outcome of the proposal is unknown",
}


def lost_leader(is_leader: bool, leader: str | None, followed: str | None, lost: str) -> bool:
    """Is the member whose connection closed the leader this follower follows, so that it should
    elect now? `leader`: the leader pysyncobj knows now; `followed`: the last one it knew. A vote
    request from the other follower, which saw the close first, makes pysyncobj forget its leader
    before this close is heard; if that follower's log was behind, its vote fails, and unless this
    member elects at once too, the next election waits out a whole election timeout (the benchmark
    saw 620 ms from the kill to the next decision)."""
    if is_leader:
        return False
    return (leader if leader is not None else followed) == lost
