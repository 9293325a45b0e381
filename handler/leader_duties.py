"""The raft leader's duties: which route-table commands the leader proposes, given the time and what it sees.

Pure: `LeaderDuties.tick(now_ms, status)` returns commands and never proposes, reads a clock or looks
at the raft member itself. The caller (handler/duties_thread.py in the raft member; tests/sim on its
event queue) supplies the time and a `RaftStatus`, and proposes what comes back in order. Every
decision is then in the raft log, so replicas agree whatever this object believed. Rules:
- Only a leader acts. A node that is not the leader, or a leader of a later term, starts afresh:
  it forgets when members became unreachable and waits before reaping again.
- The reaper (with `group_timeout_ms`) expires routes idle that long, at most once per
  `reaper_interval_ms` (by default a sixtieth of the timeout, at least REAPER_INTERVAL_MS), and only once the leader has led for `group_timeout_ms / 2`: during an
  election nobody could refresh what it holds, and those routes are not idle.
- A member the leader cannot reach cannot refresh what it relies on, and that is more than its own
  routes: its outbound store waits under routes naming other nodes, which nobody else need refresh.
  The log does not say which routes those are, so while any member is out of reach the reaper
  expires nothing, and it waits `group_timeout_ms / 2` more once the member is reachable again (as a
  new leader waits), so that the member's first refresh is in the log before anything is judged idle.
  Exception: a member marked down by owner failover or a promotion holds nothing back while it is
  away (failover gives up the order of what it holds for availability, and a dead member must not stop
  expiry for good); its own routes are still spared.
- Replica promotion (with `replica_failover_ms`): a member unreachable that long, continuously under
  this leader, that has routes and an in-sync backup this leader sees (not down, not unreachable), gets
  a Promote at its epoch (handler/replica_sets.py: its groups move to their in-sync backups, its epoch
  moves on, it is marked down). Once per epoch; proposed again a `replica_failover_ms` later if the
  epoch has not moved (a proposal lost in a leader change). Without an in-sync backup nothing is
  proposed, so a cluster whose owners stream to no backup behaves as if this duty were off.
- Owner failover (with `owner_failover_ms`): a member unreachable that long, continuously under
  this leader, is failed over (marked down, its routes dropped, its groups placed afresh:
  availability over order). A member a promotion marked down (its epoch above 0) that still has
  routes (groups without an in-sync backup) is failed over too, once per epoch under this leader: what
  promotion left. A member that is down and reachable again is marked up, on every tick until the
  log says it is up (a proposal may be lost in a leader change); a promoted member too.
- Follow consumers (with `route_follow_ms`): a (node, queue) whose node holds routes of the queue but
  has had no consumer on it for `route_follow_ms` under this leader, while another node has some, gets
  a FollowConsumers (RouteTable.follow_consumers moves those routes; the nodes hand the groups over),
  proposed again every `route_follow_ms` while it stays so (more than one command's worth of routes,
  a lost proposal). None while a member is out of reach: it would hold every move up.
`now_ms` is one clock for both the cutoff written in the log and the waits above; it must be the
clock the nodes stamp their touches with.
Never imports pysyncobj, threading, time, socket or grpc.
"""

from __future__ import annotations

from dataclasses import dataclass

REAPER_INTERVAL_MS = 1000  # the least interval between two expire_idle the leader proposes
# ...and at most this many a group timeout: expire_idle looks at every route on every replica (a
# million routes, about 0.1 s of a member's CPU each time), so with the default timeout it runs every
# 30 s, and a route outlives its timeout by at most that much
REAPER_ROUNDS_PER_TIMEOUT = 60
# The default group timeout. Expiry is safe at any value (a node refreshes every route of a group it
# holds messages of, owns for a consumer or has in its outbound store, every quarter of it), so the
# value trades how long an unused route holds memory and a routes_max slot against the refreshes it
# costs the raft log: each node proposes every route it relies on once per quarter timeout, i.e.
# live routes / (timeout / 4) entries per second per node. Thirty minutes: 1,000,000 live routes cost
# each node about 2,200 refreshes/s, a third of the ~7,000 decisions/s one raft group makes
# (docs/cluster-ceiling.md; ten minutes would take nearly all of it), 100,000 cost 220/s; an unused
# route's slot is free within thirty minutes, and a group unused for fifteen pays one route decision.
GROUP_TIMEOUT_MS_DEFAULT = 1_800_000
REPLICA_FAILOVER_MS_DEFAULT = 3000  # an owner unreachable this long has its groups promoted (docs/replication.md)
# copies of a durable queue's message, its owner's included, unless the queue says. 1 (opt-in replication)
# until the owner's lease and the hand-over of messages forwarded to a dead owner land (docs/replication.md,
# "Status"): without them a promotion while the old owner is only partitioned could let two nodes deliver a
# group, which the nemesis campaign's partition rounds would catch. Issue 28 makes 2 the default then.
REPLICATION_FACTOR_DEFAULT = 1


@dataclass(frozen=True, slots=True)
class RaftStatus:
    """What the raft member sees, as of one reading."""

    leader: bool  # this member is the raft leader
    term: int  # the raft term; a new term is a new leadership even for the same member
    reachable: tuple[str, ...]  # the other members this one is connected to
    unreachable: tuple[str, ...]  # the other members it is not connected to
    down: frozenset[str] = frozenset()  # members the replicated table has marked down
    # what the replicated table says, for following consumers (empty when route_follow_ms is 0):
    consumers: tuple[tuple[str, str, int], ...] = ()  # (node, queue, consumers), consumers > 0
    routed: tuple[tuple[str, str, int], ...] = ()  # (node, queue, routes), routes > 0
    # for replica promotion, as the table says (empty when replica_failover_ms is 0 or every member is
    # reachable: then nobody is promoted or failed over); routed is filled too
    epochs: tuple[tuple[str, int], ...] = ()  # (node, epoch), epoch > 0
    in_sync: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (owner, its in-sync backups)


@dataclass(frozen=True, slots=True)
class ExpireIdle:
    """Propose RouteTable.expire_idle(cutoff_ms, spared_nodes)."""

    cutoff_ms: int
    spared_nodes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class FailOver:
    """Propose RouteTable.fail_over(node, now_ms); `unreachable_ms` is for the log line."""

    node: str
    now_ms: int
    unreachable_ms: int


@dataclass(frozen=True, slots=True)
class Promote:
    """Propose promote(owner, epoch, now_ms, replication_factor_default) (handler/replica_sets.py);
    `unreachable_ms` is for the log line."""

    owner: str
    epoch: int
    now_ms: int
    replication_factor_default: int
    unreachable_ms: int


@dataclass(frozen=True, slots=True)
class MarkUp:
    """Propose RouteTable.mark_up(node, now_ms): a member marked down is reachable again."""

    node: str
    now_ms: int


@dataclass(frozen=True, slots=True)
class FollowConsumers:
    """Propose RouteTable.follow_consumers(queue, from_node, now_ms)."""

    queue: str
    from_node: str
    now_ms: int


class LeaderDuties:
    def __init__(self, group_timeout_ms: int = 0, owner_failover_ms: int = 0,
                 reaper_interval_ms: int | None = None, route_follow_ms: int = 0, replica_failover_ms: int = 0,
                 replication_factor: int = REPLICATION_FACTOR_DEFAULT):
        if reaper_interval_ms is None:
            reaper_interval_ms = max(REAPER_INTERVAL_MS, group_timeout_ms // REAPER_ROUNDS_PER_TIMEOUT)
        if (group_timeout_ms < 0 or owner_failover_ms < 0 or reaper_interval_ms <= 0 or route_follow_ms < 0
                or replica_failover_ms < 0):
            raise ValueError(f"leader duties need group_timeout_ms >= 0 (got {group_timeout_ms}), "
                             f"owner_failover_ms >= 0 (got {owner_failover_ms}), reaper_interval_ms > 0 "
                             f"(got {reaper_interval_ms}), route_follow_ms >= 0 (got {route_follow_ms}) "
                             f"and replica_failover_ms >= 0 (got {replica_failover_ms})")
        self.group_timeout_ms = group_timeout_ms
        self.owner_failover_ms = owner_failover_ms
        self.route_follow_ms = route_follow_ms
        self.replica_failover_ms = replica_failover_ms
        self.replication_factor = replication_factor  # the cluster default, for queues that set none
        self.promoted: dict[str, tuple[int, int]] = {}  # owner -> (epoch proposed at, when to propose again)
        self.dropped_epoch: dict[str, int] = {}  # promoted owner -> epoch at which its leftovers were failed over
        self.stranded_since_ms: dict[tuple[str, str], int] = {}  # (node, queue) -> first seen stranded
        self.follow_due_ms: dict[tuple[str, str], int] = {}  # (node, queue) -> when to propose again
        self.reaper_interval_ms = reaper_interval_ms
        self.leader_since_ms: int | None = None  # when this leadership began, as first seen by tick
        self.leader_term: int | None = None
        self.reap_due_ms = 0
        self.unreachable_since_ms: dict[str, int] = {}  # member -> when this leader first saw it unreachable
        self.returned_ms: dict[str, int] = {}  # member -> when this leader saw it reachable again

    @property
    def active(self) -> bool:
        """False when there is nothing to do: the caller need not run a thread for it."""
        return bool(self.group_timeout_ms or self.owner_failover_ms or self.route_follow_ms
                    or self.replica_failover_ms)

    def tick(self, now_ms: int, status: RaftStatus) -> list:
        if not status.leader:
            self._step_down()
            return []
        if self.leader_since_ms is None or status.term != self.leader_term:
            self._step_down()
            self.leader_since_ms, self.leader_term = now_ms, status.term
        self._observe(now_ms, status)
        commands: list = []
        if self.group_timeout_ms:
            commands += self._reap(now_ms, status)
        if self.replica_failover_ms:
            commands += self._promote(now_ms, status)
        if self.owner_failover_ms or self.replica_failover_ms:
            commands += self._fail_over(now_ms, status)
        if self.route_follow_ms:
            commands += self._follow(now_ms, status)
        return commands

    def _step_down(self) -> None:
        self.leader_since_ms = self.leader_term = None
        self.stranded_since_ms.clear()
        self.follow_due_ms.clear()
        self.unreachable_since_ms.clear()
        self.returned_ms.clear()
        self.promoted.clear()
        self.dropped_epoch.clear()

    def _observe(self, now_ms: int, status: RaftStatus) -> None:
        since, returned = self.unreachable_since_ms, self.returned_ms
        for member in status.unreachable:
            since.setdefault(member, now_ms)
            returned.pop(member, None)
        for member in status.reachable:
            if since.pop(member, None) is not None:
                returned[member] = now_ms
        for member in [member for member in since if member not in status.unreachable]:
            del since[member]  # removed from the raft cluster meanwhile
        for member in [member for member, at_ms in returned.items() if not self._sparing(member, now_ms)]:
            del returned[member]

    def _sparing(self, member: str, now_ms: int) -> bool:
        """`member` came back lately: what it relies on may not be refreshed in the log yet."""
        return now_ms - self.returned_ms[member] < self.group_timeout_ms / 2

    def _reap(self, now_ms: int, status: RaftStatus) -> list:
        settled = now_ms - self.leader_since_ms >= self.group_timeout_ms / 2
        if not settled or now_ms < self.reap_due_ms:
            return []
        if self._holding_back(status):
            return []
        self.reap_due_ms = now_ms + self.reaper_interval_ms
        # only members marked down can be out of reach here; routes naming them are spared all the same
        return [ExpireIdle(now_ms - self.group_timeout_ms, tuple(sorted(status.unreachable)))]

    def _holding_back(self, status: RaftStatus) -> bool:
        """A member out of reach, or lately back, may rely on any route: expire nothing yet."""
        return bool(self.returned_ms) or any(member not in status.down for member in status.unreachable)

    def _promote(self, now_ms: int, status: RaftStatus) -> list:
        owners = {node for node, _queue, routes in status.routed if routes > 0}
        epochs, in_sync = dict(status.epochs), dict(status.in_sync)
        commands: list = []
        for member in sorted(status.unreachable):
            unreachable_ms = now_ms - self.unreachable_since_ms[member]
            if member not in owners or unreachable_ms < self.replica_failover_ms:
                continue
            if not any(backup not in status.down and backup not in status.unreachable
                       for backup in in_sync.get(member, ())):
                continue  # no copy this leader knows is current and alive: its groups wait (or fail over)
            epoch = epochs.get(member, 0)
            proposed = self.promoted.get(member)
            if proposed is not None and proposed[0] == epoch and now_ms < proposed[1]:
                continue
            self.promoted[member] = (epoch, now_ms + self.replica_failover_ms)
            commands.append(Promote(member, epoch, now_ms, self.replication_factor, unreachable_ms))
        return commands

    def promote_dropped(self, owner: str) -> None:
        """The caller could not propose the Promote for `owner` (its code version is being enabled): it is
        due again at the next tick."""
        self.promoted.pop(owner, None)

    def _fail_over(self, now_ms: int, status: RaftStatus) -> list:
        commands: list = []
        for member in sorted(status.reachable):
            if member in status.down:
                commands.append(MarkUp(member, now_ms))
        if not self.owner_failover_ms:
            return commands
        epochs = dict(status.epochs)
        owners = {node for node, _queue, routes in status.routed if routes > 0}
        for member in sorted(status.unreachable):
            unreachable_ms = now_ms - self.unreachable_since_ms[member]
            if unreachable_ms < self.owner_failover_ms:
                continue
            if member not in status.down:
                commands.append(FailOver(member, now_ms, unreachable_ms))
            elif epochs.get(member, 0) and member in owners and self.dropped_epoch.get(member) != epochs[member]:
                self.dropped_epoch[member] = epochs[member]  # promoted, and what had no backup is left
                commands.append(FailOver(member, now_ms, unreachable_ms))
        return commands

    def _follow(self, now_ms: int, status: RaftStatus) -> list:
        serving = {(node, queue) for node, queue, count in status.consumers
                   if count > 0 and node not in status.down}
        served = {queue for _, queue in serving}
        stranded = {(node, queue) for node, queue, routes in status.routed
                    if routes > 0 and queue in served and (node, queue) not in serving}
        for pair in [pair for pair in self.stranded_since_ms if pair not in stranded]:
            del self.stranded_since_ms[pair]
            self.follow_due_ms.pop(pair, None)
        if any(member not in status.down for member in status.unreachable):
            return []  # it may hold what it sent toward the old owners: every move would wait for it
        commands = []
        for node, queue in sorted(stranded):
            since_ms = self.stranded_since_ms.setdefault((node, queue), now_ms)
            if now_ms - since_ms >= self.route_follow_ms and now_ms >= self.follow_due_ms.get((node, queue), 0):
                self.follow_due_ms[(node, queue)] = now_ms + self.route_follow_ms
                commands.append(FollowConsumers(queue, node, now_ms))
        return commands
