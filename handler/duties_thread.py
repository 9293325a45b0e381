"""The leader duties' thread: feeds the pure duties (handler/leader_duties.py) the clock and the raft
status, and proposes the commands they return.

Owns one thread of the raft member process, started only when some duty is on (the reaper, owner
failover, replica promotion, groups following consumers). It decides nothing itself: every decision is the duties' and
goes through the raft log. It only reads (the raft status, a read-only look at the route table while
the tick thread applies commands) and enqueues proposals, which never blocks; a round whose reads kept
changing is skipped and said.
"""

from __future__ import annotations

import logging
import threading
import time

from handler.leader_duties import ExpireIdle, FailOver, FollowConsumers, LeaderDuties, MarkUp, Promote, RaftStatus
from handler.proposals import logged
from handler.raft_status import member_status, read_while_applying

log = logging.getLogger("grouper.handler")

DUTIES_INTERVAL_MS = 200  # how often the leader checks members' reachability (owner failover)
DESTROY_WAIT_S = 2.0  # how long stop() waits for the thread


class DutiesThread:
    def __init__(self, duties: LeaderDuties, syncobj, replica, node_id: str, code_versions,
                 owner_failover_ms: int):
        self.duties = duties
        self._syncobj = syncobj
        self._replica = replica
        self._node_id = node_id
        self._code_versions = code_versions  # handler/code_versions.py: moves need their version enabled
        self._owner_failover_ms = owner_failover_ms
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="leader-duties", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()

    def join(self) -> None:
        self._thread.join(DESTROY_WAIT_S)

    def _run(self) -> None:
        while not self._stopped.wait(DUTIES_INTERVAL_MS / 1000):
            try:
                status = self._status()
            except TimeoutError as error:
                log.warning("leader duties skipped a round: %s", error)
                continue
            for command in self.duties.tick(int(time.time() * 1000), status):
                self._propose(command)

    def _status(self) -> RaftStatus:
        if not self._syncobj._isLeader():
            return RaftStatus(leader=False, term=0, reachable=(), unreachable=())
        status = member_status(self._syncobj, self._node_id)
        others = [member for member in status["members"] if member != self._node_id]
        unreachable = tuple(member for member in others if member not in status["connected"])
        table = {}
        if self.duties.route_follow_ms:
            table.update(self._placement())
        if self.duties.replica_failover_ms and unreachable:  # nobody to promote while every member answers
            table.update(self._replica_sets())
        return RaftStatus(
            leader=status["state"] == "leader", term=status["term"],
            reachable=tuple(member for member in others if member in status["connected"]), unreachable=unreachable,
            down=frozenset(self._replica.table.down),  # a read-only look; decisions go through the log
            **table)

    def _placement(self) -> dict:
        """The table's consumers and routes per node and queue, for following consumers: a read-only
        look from this thread while the tick thread applies commands."""
        table = self._replica.table
        return read_while_applying(lambda: {
            "consumers": tuple((node, queue, count) for node, held in sorted(dict(table.consumers).items())
                               for queue, count in sorted(dict(held).items())),
            "routed": tuple((node, queue, count) for (node, queue), count in sorted(dict(table.route_counts).items())),
        }, "the route table")

    def _replica_sets(self) -> dict:
        """The table's routes per node and queue, owner epochs and in-sync backups, for replica promotion
        (and owner failover after it): a read-only look."""
        table = self._replica.table
        return read_while_applying(lambda: {
            "routed": tuple((node, queue, count) for (node, queue), count in sorted(dict(table.route_counts).items())),
            "epochs": tuple(sorted(dict(table.epochs).items())),
            "in_sync": tuple((owner, tuple(backups)) for owner, backups in sorted(dict(table.in_sync).items())),
        }, "the route table")

    def _propose(self, command) -> None:
        replica = self._replica
        if isinstance(command, ExpireIdle):
            replica.expire_idle(command.cutoff_ms, list(command.spared_nodes), callback=logged("expire_idle"))
        elif isinstance(command, Promote):
            if not self._code_versions.replicas_enabled():
                self.duties.promote_dropped(command.owner)  # proposed again at the next tick
                return
            log.warning("REPLICA PROMOTION: member %s unreachable for %d ms (replica_failover_ms=%d): its groups "
                        "move to their in-sync backups, its epoch becomes %d; groups without one wait for it",
                        command.owner, command.unreachable_ms, self.duties.replica_failover_ms, command.epoch + 1)
            replica.promote(command.owner, command.epoch, command.now_ms, command.replication_factor_default,
                            callback=logged("promote"))
        elif isinstance(command, FailOver):
            log.warning("OWNER FAILOVER: member %s unreachable for %d ms (owner_failover_ms=%d): marking it "
                        "down and moving its groups to live nodes; messages it still holds for them may be "
                        "processed out of order if it returns", command.node, command.unreachable_ms,
                        self._owner_failover_ms)
            replica.fail_over(command.node, command.now_ms, callback=logged("fail_over"))
        elif isinstance(command, FollowConsumers):
            if not self._code_versions.moves_enabled():
                return  # the duties propose it again a route_follow_ms later
            log.info("groups of queue %r follow their consumers away from %s (no consumer there for %d ms, "
                     "route_follow_ms)", command.queue, command.from_node, self.duties.route_follow_ms)
            replica.follow_consumers(command.queue, command.from_node, command.now_ms,
                                     callback=logged("follow_consumers"))
        elif isinstance(command, MarkUp):
            log.warning("member %s is reachable again: marking it up; groups moved away while it was "
                        "down stay where they are now", command.node)
            replica.mark_up(command.node, command.now_ms, callback=logged("mark_up"))
        else:
            raise AssertionError(f"leader duties returned an unknown command {command!r}")
