"""The grouping handler of one node: its raft member, the calls the node makes, and the leader's duties.

It runs in the node's raft member process (handler/member.py), never in the node itself, which
reaches it through handler/member_process.py. Threads: pysyncobj's tick thread owns the replica and
runs every callback; callers on other threads (the member's channel reader, the duties thread) only
enqueue commands, which never blocks, and hear back through the callbacks they pass, on the tick
thread. The raft leader is the LOCAL handler: every proposal is decided in log order there; the
other members forward theirs to it (pysyncobj does). Its parts:
- handler/raft_setup.py: pysyncobj's configuration and start (the leader's catch-up rule of
  handler/raft_catch_up.py, handler/raft_transport.py's checked connections, `raft_secrets`).
- handler/leader_watch.py: what the member notices of its leader, and the early election when it goes.
- handler/code_versions.py: enabling newer replicated commands before proposing them.
- handler/duties_thread.py: the leader's duties (handler/leader_duties.py decides them: the reaper,
  replica promotion, owner failover, groups following consumers), fed the clock and the raft status.
- handler/proposals.py: what a proposer hears back; handler/raft_status.py: the member's status.
"""

from __future__ import annotations

import logging
import os

from handler.code_versions import FORGET_CODE_VERSION, CodeVersions
from handler.duties_thread import DutiesThread
from handler.leader_duties import REPLICATION_FACTOR_DEFAULT, LeaderDuties
from handler.leader_watch import LeaderWatch
from handler.placement import PLACEMENT_BALANCED
from handler.proposals import callback, logged
from handler.raft_setup import start_raft
from handler.raft_status import leader_contact_age_ms, member_status
from handler.replicated import PYSYNCOBJ_LOGGER, RefuseNewerCommands, RouteTableReplica

log = logging.getLogger("grouper.handler")


class GroupingHandler:
    def __init__(self, node_id: str, partners: list[str], raft_dir: str, *, on_applied, on_ready,
                 election_timeout_min_ms: int, election_timeout_max_ms: int, routes_max: int,
                 group_timeout_ms: int = 0, owner_failover_ms: int = 0, route_follow_ms: int = 0,
                 placement: str = PLACEMENT_BALANCED, bind_host: str = "", raft_secrets: tuple[str, ...] = (),
                 replica_failover_ms: int = 0, replication_factor: int = REPLICATION_FACTOR_DEFAULT):
        os.makedirs(raft_dir, exist_ok=True)
        self.node_id = node_id
        self.placement = placement  # goes into every claim: replicas place by the proposer's mode, never their own
        self.group_timeout_ms = group_timeout_ms
        self.owner_failover_ms = owner_failover_ms
        self.replica = RouteTableReplica(on_applied, routes_max)
        # see handler/replicated.py; removed again by stop(), as the logger outlives this handler
        self._refuse_newer = RefuseNewerCommands()
        logging.getLogger(PYSYNCOBJ_LOGGER).addHandler(self._refuse_newer)
        self.leader_watch = LeaderWatch((election_timeout_min_ms, election_timeout_max_ms), on_ready)
        self._syncobj = start_raft(node_id, partners, raft_dir, self.replica, self.leader_watch,
                                   election_timeout_ms=(election_timeout_min_ms, election_timeout_max_ms),
                                   bind_host=bind_host, raft_secrets=raft_secrets)
        self.code_versions = CodeVersions(self._syncobj, self.replica)
        self.duties = LeaderDuties(group_timeout_ms, owner_failover_ms, route_follow_ms=route_follow_ms,
                                   replica_failover_ms=replica_failover_ms, replication_factor=replication_factor)
        self._duties = None
        if self.duties.active:
            self._duties = DutiesThread(self.duties, self._syncobj, self.replica, node_id, self.code_versions,
                                        owner_failover_ms)
            self._duties.start()

    # ---- calls from the node (any thread; none blocks) ---------------------------------------

    def claim(self, keys: list, now_ms: int, on_failed, on_committed=None) -> None:
        """Propose routes for `keys`; decided ones arrive through on_applied; on_failed(keys, reason),
        else on_committed() once the proposal is in the log."""
        # placed on registered members only once every member applies that: the log enabled version 4 (the
        # first remove-node does; a member of older code stopped then), handler/placement.py
        members_only = (True,) if self._syncobj.getCodeVersion() >= FORGET_CODE_VERSION else ()
        self.replica.claim([list(key) for key in keys], self.node_id, now_ms, self.placement, *members_only,
                           callback=callback(lambda reason: on_failed(keys, reason), on_committed))

    def touch(self, entries: list, now_ms: int, on_failed, on_committed=None) -> None:
        """Refresh routes this node relies on: [queue, group, node] each (see RouteTable.touch)."""
        self.replica.touch([list(entry) for entry in entries], now_ms,
                           callback=callback(lambda reason: on_failed(entries, reason), on_committed))

    def report_consumers(self, counts: dict, now_ms: int) -> None:
        self.replica.report_consumers(self.node_id, counts, now_ms, callback=logged("report_consumers"))

    def register(self, peer_address: str, amqp_address: str, admin_address: str, now_ms: int, on_done) -> None:
        self.replica.register_node(self.node_id, peer_address, amqp_address, admin_address, now_ms,
                                   callback=callback(on_done, on_success=lambda: on_done(None)))

    def move_clear(self, entries: list) -> None:
        """This node holds and sends nothing more of these moving groups toward their old owners: entries
        are [queue, group, from_node, to_node] (see RouteTable.move_clear); a lost one is proposed again."""
        if self.code_versions.moves_enabled():
            self.replica.move_clear([list(entry) for entry in entries], self.node_id,
                                    callback=logged("move_clear"))

    def unroute(self, keys: list) -> None:
        self.replica.unroute([list(key) for key in keys], callback=logged("unroute"))

    def drop_queue(self, queue: str) -> None:
        self.replica.drop_queue(queue, callback=logged("drop_queue"))

    def define_queue(self, values: dict, seed: bool, on_result) -> None:
        """Propose a queue definition (handler/queue_definitions.py); on_result(reason, result): reason
        None once applied, with the command's result [outcome, definition]."""
        self.code_versions.with_queues_enabled(on_result, lambda done: self.replica.define_queue(
            values, seed, callback=done))

    def update_queue(self, name: str, changes: dict, on_result) -> None:
        self.code_versions.with_queues_enabled(on_result, lambda done: self.replica.update_queue(
            name, changes, callback=done))

    def delete_queue(self, name: str, seen_revision: int, on_result) -> None:
        self.code_versions.with_queues_enabled(on_result, lambda done: self.replica.delete_queue(
            name, seen_revision, callback=done))

    def replica_in_sync(self, backup: str, epoch: int, on_result) -> None:
        """This node, as an owner at `epoch`, says `backup` holds a current copy (handler/replica_sets.py);
        on_result(reason, result): reason None once applied, result whether the set changed."""
        self.code_versions.with_replicas_enabled(on_result, lambda done: self.replica.replica_in_sync(
            self.node_id, backup, epoch, callback=done))

    def replica_out_of_sync(self, owner: str, backup: str, epoch: int, on_result) -> None:
        """`backup` leaves `owner`'s in-sync set: proposed by the owner (it lags) or by the backup (it lost
        its state), with the owner's epoch as the proposer knows it."""
        self.code_versions.with_replicas_enabled(on_result, lambda done: self.replica.replica_out_of_sync(
            owner, backup, epoch, callback=done))

    def forget_node(self, node: str, on_result) -> None:
        """Forget `node`, removed from the raft cluster (handler/member_removal.py); on_result(reason, result):
        reason None once applied, result how many of its routes were dropped."""
        self.code_versions.with_forget_enabled(on_result, lambda done: self.replica.forget_node(node, callback=done))

    def add_member(self, node: str, on_done) -> None:
        self._syncobj.addNodeToCluster(node, callback=callback(on_done, on_success=lambda: on_done(None)))

    def remove_member(self, node: str, on_done) -> None:
        self._syncobj.removeNodeFromCluster(node, callback=callback(on_done, on_success=lambda: on_done(None)))

    def compact_log(self) -> None:
        """Compact the raft log into a snapshot at pysyncobj's next chance, whatever its own thresholds
        (handler/member.py bounds the log's memory by the route changes it carries)."""
        self._syncobj.forceLogCompaction()

    # ---- state -------------------------------------------------------------------------------

    def status(self) -> dict:
        return member_status(self._syncobj, self.node_id)

    def leader_contact_age_ms(self) -> int | None:
        """For the owner's lease (issue 28): see handler/raft_status.py."""
        return leader_contact_age_ms(self._syncobj)

    def stop(self) -> None:
        if self._duties is not None:
            self._duties.stop()
        self._syncobj.destroy()
        logging.getLogger(PYSYNCOBJ_LOGGER).removeHandler(self._refuse_newer)
        if self._duties is not None:
            self._duties.join()
