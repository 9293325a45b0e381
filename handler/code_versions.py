"""Raft code versions: enabling the replicated commands newer than the first ones before proposing them.

Owns when this member may propose a command of a newer raft code version (handler/replicated.py's ver=1
moves, ver=2 queue definitions, ver=3 replica sets, ver=4 forget_node), and proposing the setCodeVersion
entry that enables it. pysyncobj proposes such a command only once a setCodeVersion entry in the log enabled its version (and forgets
it when a restart loads a compacted log), so a member proposes that entry the first time it would
propose one of them:
- moves (MOVES_CODE_VERSION): the proposal that found them not enabled is dropped (the leader's duties
  and the node propose again later). Every member must run this code by then (route_follow_ms on all).
- queue definitions (QUEUES_CODE_VERSION): the proposal waits for that entry, then goes (an admin waits).
- replica sets (REPLICAS_CODE_VERSION): as moves for the leader's promote (its duties propose again);
  as queue definitions for an owner's in-sync changes (`with_replicas_enabled`: it hears the outcome).
- forgetting a removed member (FORGET_CODE_VERSION): as queue definitions (remove-node waits for it).
Threads: callers on any thread only enqueue proposals; the callbacks run on pysyncobj's tick thread.
"""

from __future__ import annotations

import logging

from handler.proposals import callback, reason_for

log = logging.getLogger("grouper.handler")

MOVES_CODE_VERSION = 1  # the raft code version of the commands moves need (ver=1 in handler/replicated.py)
QUEUES_CODE_VERSION = 2  # the raft code version of the queue definition commands (ver=2)
REPLICAS_CODE_VERSION = 3  # the raft code version of the replica sets' commands (ver=3)
FORGET_CODE_VERSION = 4  # the raft code version of forget_node, a removed member forgotten (ver=4)


class CodeVersions:
    def __init__(self, syncobj, replica):
        self._syncobj = syncobj
        self._replica = replica  # the consumer whose commands pysyncobj names
        self._proposed: set[int] = set()  # code versions whose setCodeVersion entry is in flight (moves, replicas)

    def moves_enabled(self) -> bool:
        """Moves' commands can be proposed now; if not, the entry that enables them is proposed (once)."""
        return self._enabled(MOVES_CODE_VERSION, "move_clear", "groups follow their consumers")

    def replicas_enabled(self) -> bool:
        """The replica sets' commands (promote) can be proposed now; else as moves_enabled."""
        return self._enabled(REPLICAS_CODE_VERSION, "promote", "owner epochs and replica promotion")

    def _enabled(self, wanted: int, command: str, what: str) -> bool:
        if self.usable(wanted, command):
            return True
        if wanted not in self._proposed:
            self._proposed.add(wanted)
            version = self.to_enable(wanted)
            log.info("enabling raft code version %d (%s)", version, what)

            def failed(reason):
                self._proposed.discard(wanted)
                log.warning("grouping handler: enabling raft code version %d failed: %s; retrying",
                            version, reason)
            self._syncobj.setCodeVersion(version, callback=callback(failed))
        return False

    def with_queues_enabled(self, on_result, propose) -> None:
        """propose(callback) a queue definition command once its code version is enabled; on_result(reason,
        result) hears its outcome, or why enabling the version failed."""
        self._with_enabled(QUEUES_CODE_VERSION, "define_queue", "cluster-wide queue definitions", on_result,
                           propose)

    def with_replicas_enabled(self, on_result, propose) -> None:
        """As with_queues_enabled, for the replica sets' commands (an owner's in-sync changes)."""
        self._with_enabled(REPLICAS_CODE_VERSION, "replica_in_sync", "owner epochs and replica promotion",
                           on_result, propose)

    def with_forget_enabled(self, on_result, propose) -> None:
        """As with_queues_enabled, for forget_node (remove-node waits for its outcome)."""
        self._with_enabled(FORGET_CODE_VERSION, "forget_node", "removed members forgotten", on_result, propose)

    def _with_enabled(self, wanted: int, command: str, what: str, on_result, propose) -> None:
        def proposed(result, error):
            on_result(reason_for(error), result)
        if self.usable(wanted, command):
            propose(proposed)
            return

        def enabled(_result, error):  # tick thread; proposing from here only enqueues
            reason = reason_for(error)
            if reason is not None:
                on_result(f"enabling raft code version {wanted} failed: {reason}", None)
            else:
                propose(proposed)
        version = self.to_enable(wanted)
        log.info("enabling raft code version %d (%s)", version, what)
        self._syncobj.setCodeVersion(version, callback=enabled)

    def to_enable(self, version: int) -> int:
        """The code version to propose for commands of `version`: the one enabled already when it is
        newer. pysyncobj refuses (raises, which ended the member) a version below the enabled one, and
        after a snapshot load a member must enable its commands again (usable): with queue definitions
        (2) enabled, moves (1) asked for 1 (nemesis follow campaigns, 2026-11-24)."""
        return max(version, self._syncobj.getCodeVersion())

    def usable(self, version: int, command: str) -> bool:
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
            self._syncobj._getFuncName((id(self._replica), command))
        except KeyError:
            return False
        return True
