"""The route table and the queue definitions as a pysyncobj consumer: replicated delegates and a feed.

Runs on pysyncobj's tick thread only. Every replicated method delegates to `RouteTable`, whose
commands are deterministic and idempotent. After each applied command the replica reports what
changed through `on_applied(kind, payload)`, still on the tick thread, in log order; the runtime
forwards that to the engine loop. Snapshots hold the table's and the definitions' attributes, which
are plain data (a snapshot taken before definitions existed restores none).
The queue definition commands (handler/queue_definitions.py) are ver=2 and the replica sets' commands
(handler/replica_sets.py: replica_in_sync, replica_out_of_sync, promote) ver=3: numbered after every
older command, so journals written before them replay unchanged.

Format versions:
- Commands: a command's version is its pysyncobj `ver`. pysyncobj numbers commands by (ver, name), so
  a new command gets a higher ver and every older number keeps its meaning; a member proposes one only
  after a setCodeVersion entry enabled that ver, and a member whose code is older than an enabled ver
  meets it. pysyncobj then only logs "request to switch to unsupported code version" and goes on
  applying the entries after it (applying one of them twice), so `RefuseNewerCommands` turns that log
  record into a refusal by name that stops the member (handler/service.py installs it). A changed
  command is a new name or a new keyword argument with a default, never a changed meaning.
- Snapshots carry SNAPSHOT_FORMAT_VERSION under "format_version" (absent: 1, as every snapshot before
  versions). One this build does not read is refused by name: pysyncobj swallows exceptions from
  `_deserialize` and would go on with an empty table, so `on_refused` stops the member instead.
  Version 1 held the table's attributes with routes {(queue, group): [node, touched_ms]}; version 2
  the table's state with routes packed per queue in dicts {queue: {group: packed}}; version 3
  RouteTable.state(), each queue's routes as its GroupMap's state (node/core/group_map.py: buckets
  of bytes); version 4 as 3 with the owner epochs and in-sync backups ("epochs", "in_sync"), which
  versions 1-3 restore empty. This build reads all four and writes 4, so a member upgraded in place
  restores its old snapshot. A snapshot of a version it reads whose table is damaged (a GroupMap's buckets
  inconsistent, a part missing) is refused the same way: going on with an empty table would split
  this replica from the others.
"""

from __future__ import annotations

import logging
import os

from pysyncobj import SyncObjConsumer, replicated

from handler.queue_definitions import QueueDefinitions
from handler.removal_commands import RemovalCommands
from handler.placement import PLACEMENT_LOCAL
from handler.route_snapshots import from_state_v1, from_state_v2, from_state_v3
from handler.route_table import RouteTable
from node.core.cluster.feed import (ADDED, MEMBERS, MOVES, MOVES_ALL, QUEUES, QUEUES_ALL, REFUSED,  # the feed's kinds
                                    REPLICAS, ROUTES, SNAPSHOT, UPDATED)

log = logging.getLogger("grouper.handler")

SNAPSHOT_FORMAT_VERSION = 4  # what this build writes
SNAPSHOT_FORMAT_VERSIONS_READ = (1, 2, 3, 4)  # what it reads; a newer build keeps reading the one before it
EXIT_UNREADABLE_SNAPSHOT = 3  # the member's exit status after refusing a snapshot


PYSYNCOBJ_LOGGER = "pysyncobj.syncobj"
PYSYNCOBJ_WRONG_VERSION = "request to switch to unsupported code version"  # its log text, checked by a test


class RefuseNewerCommands(logging.Handler):
    """On pysyncobj's wrong-version log record: `on_refused(reason)` naming both versions."""

    def __init__(self, on_refused=None):
        super().__init__(logging.ERROR)
        self._on_refused = on_refused or _exit_refused

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if text.startswith(PYSYNCOBJ_WRONG_VERSION):
            self._on_refused(f"the raft log enables a command version this build does not have ({text}): "
                             f"a newer member proposed it. Run that build on this member (upgrade one "
                             f"version step at a time), never an older one after it")


class SnapshotRefused(Exception):
    """A raft snapshot in a format this build does not read (a newer member wrote it)."""


def _exit_refused(reason: str) -> None:
    log.critical("%s", reason)
    logging.shutdown()
    os._exit(EXIT_UNREADABLE_SNAPSHOT)  # an exception would be swallowed by pysyncobj: see the header


class RouteTableReplica(RemovalCommands, SyncObjConsumer):  # forget_node (ver=4) is RemovalCommands's
    def __init__(self, on_applied, routes_max: int, on_refused=_exit_refused):
        # set before SyncObjConsumer.__init__, so pysyncobj leaves them out of snapshots
        self._on_applied = on_applied
        self._routes_max = routes_max
        self._on_refused = on_refused  # (reason): a snapshot this build cannot read arrived
        super().__init__()
        self.table = RouteTable(routes_max)
        self.queues = QueueDefinitions()

    # ---- snapshots: the table's attributes, as plain data ------------------------------------

    def _serialize(self):
        return {"format_version": SNAPSHOT_FORMAT_VERSION, "route_table": self.table.state(),
                "queue_definitions": dict(vars(self.queues))}

    def _deserialize(self, data):
        version = data.get("format_version", 1) if isinstance(data, dict) else None
        if version not in SNAPSHOT_FORMAT_VERSIONS_READ:
            reason = (f"raft snapshot of format version {version!r} (from this member's raft dump or its "
                      f"leader) cannot be read by this build, which reads versions "
                      f"{', '.join(map(str, SNAPSHOT_FORMAT_VERSIONS_READ))}: a newer build wrote it. Run "
                      f"that build (upgrade one version step at a time), never an older one after it")
            self._on_refused(reason)
            raise SnapshotRefused(reason)
        try:
            if version == 1:
                table = from_state_v1(data["route_table"])
            elif version == 2:
                table = from_state_v2(data["route_table"])
            elif version == 3:
                table = from_state_v3(data["route_table"])
            else:
                table = RouteTable.from_state(data["route_table"])
        except (KeyError, TypeError, ValueError) as error:  # swallowed by pysyncobj otherwise: see the header
            reason = (f"raft snapshot of format version {version} (from this member's raft dump or its leader) "
                      f"is damaged: {type(error).__name__}: {error}. Move this member's raft directory aside "
                      f"and restart it, so that it catches up from the leader")
            self._on_refused(reason)
            raise SnapshotRefused(reason) from error
        self.table = table
        self._on_applied(SNAPSHOT, sorted((queue, group, node, touched_ms)
                                          for (queue, group), (node, touched_ms) in table.entries()), None)
        self._on_applied(MOVES_ALL, table.moves_all(), None)
        self._publish_members()
        self._publish_replicas()
        queues = QueueDefinitions()
        vars(queues).update(data.get("queue_definitions", {}))
        self.queues = queues
        self._on_applied(QUEUES_ALL, (queues.revision, queues.all(), dict(queues.deleted)), None)

    # ---- replicated commands -----------------------------------------------------------------

    # placement: the proposer's mode travels in the command, so every replica places alike. pysyncobj
    # journals (number, args) and numbers commands by (ver, name), so an argument with a default keeps
    # claim_v0; claims journalled before it existed replay with the rule they were decided by (local)
    @replicated
    def claim(self, keys, proposer, now_ms, placement=PLACEMENT_LOCAL, members_only=False):
        nodes = self.table.claim(keys, proposer, now_ms, placement, members_only)
        decided = [(key[0], key[1], node) for key, node in zip(keys, nodes) if node is not None]
        if decided:
            self._on_applied(ROUTES, decided, now_ms)
        if len(decided) < len(keys):
            self._on_applied(REFUSED, [tuple(key) for key, node in zip(keys, nodes) if node is None], None)
        return len(decided)

    @replicated
    def touch(self, entries, now_ms):
        results = self.table.touch(entries, now_ms)
        # only what was refreshed or made: a conflicting route's node already heard of it when it was made
        kept = [(entry[0], entry[1], node) for entry, node in zip(entries, results) if node is not None
                and node == entry[2]]
        if kept:
            self._on_applied(ROUTES, kept, now_ms)
        conflicts = sum(1 for entry, node in zip(entries, results) if node is not None and node != entry[2])
        if conflicts:
            log.warning("%d route refreshes named a node other than the route's; the routes were kept", conflicts)
        return len(kept)

    @replicated
    def expire_idle(self, cutoff_ms, spared_nodes=()):
        return self._removed(self.table.expire_idle(cutoff_ms, list(spared_nodes)))

    @replicated
    def unroute(self, keys):
        return self._removed(self.table.unroute(keys))

    @replicated
    def drop_queue(self, queue):
        return self._removed(self.table.drop_queue(queue))

    # ver=1: numbered after every command of ver 0, which old raft journals name by number
    @replicated(ver=1)
    def follow_consumers(self, queue, from_node, now_ms):
        begun = self.table.follow_consumers(queue, from_node, now_ms)
        if begun:  # the moves first: a new owner holds the group before the route names it
            self._on_applied(MOVES, begun, None)
            self._on_applied(ROUTES, [(moved_queue, group, to_node) for moved_queue, group, _, to_node, _ in begun],
                             now_ms)
        return len(begun)

    @replicated(ver=1)
    def move_clear(self, entries, node):
        changed = self.table.move_clear(entries, node)
        if changed:
            self._on_applied(MOVES, changed, None)
        return len(changed)

    # ---- queue definitions (ver=2: see the header) ----------------------------------------------

    @replicated(ver=2)
    def define_queue(self, values, seed):
        outcome, held = self.queues.define(values, seed)
        if outcome == ADDED:
            self._on_applied(QUEUES, [(self.queues.revision, values["name"], held)], None)
        return [outcome, held]

    @replicated(ver=2)
    def update_queue(self, name, changes):
        outcome, detail = self.queues.update(name, changes)
        if outcome == UPDATED:
            self._on_applied(QUEUES, [(self.queues.revision, name, detail)], None)
        return [outcome, detail]

    @replicated(ver=2)
    def delete_queue(self, name, seen_revision):
        revision = self.queues.revision
        outcome, held = self.queues.delete(name, seen_revision)
        dropped = 0
        if self.queues.revision != revision:
            # the routes go first: a message arriving between the two waits for a new route, which the
            # log decides after this entry, so every node has dropped the old queue by then
            dropped = self._removed(self.table.drop_queue(name))
            self._on_applied(QUEUES, [(self.queues.revision, name, None)], None)
        return [outcome, held, dropped]

    @replicated
    def report_consumers(self, node, counts, now_ms):
        self.table.report_consumers(node, counts, now_ms)
        self._publish_members()

    @replicated
    def register_node(self, node, peer_address, amqp_address, admin_address, now_ms):
        in_sync = self.table.in_sync
        had_sets = bool(in_sync)
        self.table.register_node(node, peer_address, amqp_address, admin_address, now_ms)
        self._publish_members()
        if had_sets and not in_sync:  # a new member name emptied the sets (handler/replica_sets.py)
            self._publish_replicas()

    @replicated
    def mark_down(self, node, now_ms):
        self.table.mark_down(node, now_ms)
        self._publish_members()

    @replicated
    def fail_over(self, node, now_ms):
        moves = self.table.moves_all()
        dropped = self._removed(self.table.fail_over(node, now_ms))
        if self.table.moves_all() != moves:  # it is waited for no more
            self._on_applied(MOVES_ALL, self.table.moves_all(), None)
        self._publish_members()
        return dropped

    @replicated
    def mark_up(self, node, now_ms):
        self.table.mark_up(node, now_ms)
        self._publish_members()

    # ---- replica sets (ver=3: see the header; handler/replica_sets.py has the rules) ------------

    @replicated(ver=3)
    def replica_in_sync(self, owner, backup, epoch):
        changed = self.table.replica_sets().replica_in_sync(owner, backup, epoch)
        if changed:
            self._publish_replicas()
        return changed

    @replicated(ver=3)
    def replica_out_of_sync(self, owner, backup, epoch):
        changed = self.table.replica_sets().replica_out_of_sync(owner, backup, epoch)
        if changed:
            self._publish_replicas()
        return changed

    @replicated(ver=3)
    def promote(self, owner, epoch, now_ms, replication_factor_default):
        factors = {name: values["replication_factor"] for name, values in sorted(self.queues.definitions.items())
                   if "replication_factor" in values}
        moved = self.table.replica_sets().promote(owner, epoch, now_ms, replication_factor_default, factors)
        if moved is None:
            return []
        # the epoch first: a node learns it is a group's new owner, at which epoch, before the route says so
        self._publish_replicas()
        self._publish_members()  # the owner is down
        if moved:
            self._on_applied(ROUTES, moved, now_ms)
        return moved

    # ---- feed --------------------------------------------------------------------------------

    def _removed(self, keys):
        if keys:
            self._on_applied(ROUTES, [(queue, group, None) for queue, group in keys], None)
        return len(keys)

    def _publish_members(self):
        table = self.table
        self._on_applied(MEMBERS, {"nodes": {node: dict(info) for node, info in table.nodes.items()},
                                   "consumers": {node: dict(counts) for node, counts in table.consumers.items()},
                                   "down": dict(table.down)}, None)

    def _publish_replicas(self):
        self._on_applied(REPLICAS, self.table.replica_sets().copy(), None)
