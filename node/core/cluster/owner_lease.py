"""The owner's lease (issue 28, docs/replication.md "Epochs and leases decide who serves"): whether this node
may serve the groups of its replicated queues (replication factor above 1) now.

Rules:
- A node serves them only while it heard from the raft leader within `lease_ms`: past that it delivers none
  of their messages and refuses their sends (OwnerLeaseLapsed, retriable) until contact returns. The leader
  promotes an owner's groups only after it found the owner unreachable for `replica_failover_ms`
  (handler/leader_duties.py); `check_lease` makes the lease end first, with a margin, so no window exists in
  which the old owner and the promoted backup both deliver a group.
- Contact is measured conservatively, on this node's monotonic clock: the node asks its raft member how long
  ago it last heard from the leader (`age_ms`) and counts the contact at the moment it SENT that question
  minus the age (`contacted(sent_ms, age_ms)`), never later: the member's own moment is no earlier than
  that. The member's age is itself conservative: for a follower, the receipt of the leader's last message,
  counted only once everything the leader had committed is applied (so a promotion of this node's groups
  reaches the node before the contact that follows it); a leader counts as in contact with itself, since it
  steps down after its raft fallback timeout without a majority (handler/raft_setup.py). Both ends measure
  intervals on monotonic clocks of the member that acts, so the rule needs bounded clock rates, not
  synchronised clocks: the leader-lease argument of Raft's section 6.4.
- Resuming after a lapse is this module's; whether the node still owns a group after it (its epoch moved
  meanwhile: fencing) is node/core/cluster/takeovers.py's, which holds the groups it lost.
- Pure: time comes in as integers; imports nothing of the node but the errors (LeaseGate is given the
  protocol's context).
"""

from __future__ import annotations

from node.core.errors import HandlerUnavailable

REPLICA_LEASE_MS_DEFAULT = 1500  # half of REPLICA_FAILOVER_MS_DEFAULT (3000)
# what the lease must leave of replica_failover_ms besides the raft leader's fallback: the node's tick (100 ms,
# when a lapse is noticed), the contact question's interval (one tick) and scheduling delays
LEASE_MARGIN_MS = 250


class OwnerLeaseLapsed(HandlerUnavailable):
    """This node has not heard from the raft leader for replica_lease_ms, so it may have lost its groups to a
    backup: the node is cut off, not the client. Retriable (HandlerUnavailable's condition on the wire): send
    again (another node may route it to the group's owner), or here once the node hears from the leader."""

    def __init__(self, queue: str, lease_ms: int):
        super().__init__(f"queue {queue!r} is replicated and this node has not heard from the raft leader for "
                         f"replica_lease_ms={lease_ms} ms (the owner's lease lapsed): it neither accepts nor "
                         f"delivers the queue's messages until contact returns; send again, to another node or "
                         f"here later")
        self.queue = queue
        self.lease_ms = lease_ms


def leader_fallback_ms(election_timeout_max_ms: int) -> int:
    """How long a raft leader goes on as leader without hearing from a majority before it steps down (pysyncobj's
    leaderFallbackTimeout, handler/raft_setup.py): twice the longest election timeout, so a loaded member is
    not deposed by one late round of heartbeats, while its heartbeats to a cut-off owner stop soon after."""
    return 2 * election_timeout_max_ms


def check_lease(lease_ms: int, failover_ms: int, leader_fallback_ms: int) -> str | None:
    """What is wrong with `lease_ms` against the leader's `failover_ms`, or None. The owner's last contact can
    come up to `leader_fallback_ms` after the leader's last contact with a majority (a deposed leader's
    heartbeats go on that long), so the lease plus that fallback plus LEASE_MARGIN_MS must fit in failover."""
    if failover_ms == 0:
        return None if lease_ms >= 0 else "must be >= 0 ms"
    if lease_ms < 1:
        return (f"must be >= 1 ms while replica_failover_ms ({failover_ms} ms) promotes backups: an owner without "
                f"a lease could go on delivering after its groups were promoted")
    room_ms = failover_ms - leader_fallback_ms - LEASE_MARGIN_MS
    if lease_ms > room_ms:
        return (f"must be at most replica_failover_ms ({failover_ms}) - the raft leader's fallback "
                f"({leader_fallback_ms}, twice election_timeout_max_ms) - {LEASE_MARGIN_MS} = {room_ms} ms, so an "
                f"owner cut off stops serving before its groups are promoted; lower it or raise replica_failover_ms")
    return None


class OwnerLease:
    __slots__ = ("lease_ms", "contact_ms", "lapsed")

    def __init__(self, lease_ms: int):
        self.lease_ms = lease_ms  # 0: no lease (nothing is promoted, or a single node)
        self.contact_ms: int | None = None  # monotonic ms of the last contact, counted conservatively
        # as of the last `review`: what dispatch and sends read between reviews. A node starts without contact,
        # so lapsed: it serves its replicated queues from the first answer of its raft member on
        self.lapsed = lease_ms > 0

    def contacted(self, sent_ms: int, age_ms: int) -> None:
        """The member, asked at `sent_ms`, last heard from the leader `age_ms` before it answered."""
        moment_ms = sent_ms - max(age_ms, 0)
        if self.contact_ms is None or moment_ms > self.contact_ms:
            self.contact_ms = moment_ms

    def serving(self, now_ms: int) -> bool:
        if not self.lease_ms:
            return True
        return self.contact_ms is not None and now_ms - self.contact_ms < self.lease_ms

    def review(self, now_ms: int) -> bool | None:
        """Update `lapsed`; True when it lapsed now, False when it came back now, None when unchanged."""
        lapsed = not self.serving(now_ms)
        if lapsed == self.lapsed:
            return None
        self.lapsed = lapsed
        return lapsed


def replicated(settings, replication_factor_default: int) -> bool:
    """Whether a queue's messages have backups, so its owner needs the lease (as replication_link.py counts)."""
    return settings.durable and (settings.replication_factor or replication_factor_default) > 1


class LeaseGate:
    """The lease applied to this node's broker: its replicated queues' dispatch held while lapsed, their sends
    and forwarded batches refused. O(1) per message: sends read `lease.lapsed` and one queue's settings;
    dispatch reads one flag per queue (Queue.hold_dispatch); the queues are walked only at a review."""

    def __init__(self, context, lease_ms: int, replication_factor_default: int, fencing):
        self.context = context  # context.py's: the broker, and how its effects join the protocol's
        self.broker = context.broker
        self.lease = OwnerLease(lease_ms)
        self.replication_factor_default = replication_factor_default
        # fencing(): this node's epoch moved above the one it served with and takeovers.py has not yet held and
        # emptied the groups it lost: a lapsed lease does not come back before that
        self.fencing = fencing

    def refusal(self, queue: str) -> OwnerLeaseLapsed | None:
        """Why a message of `queue` may not be accepted here as its owner now, or None."""
        if not self.lease.lapsed:
            return None
        held = self.broker.queues.get(queue)
        if held is None or not replicated(held.settings, self.replication_factor_default):
            return None
        return OwnerLeaseLapsed(queue, self.lease.lease_ms)

    def contacted(self, sent_ms: int, age_ms: int) -> None:
        self.lease.contacted(sent_ms, age_ms)

    def review(self, monotonic_ms: int, now_ms: int, effects: list) -> bool | None:
        """At each tick, after the protocol's (`monotonic_ms` for the lease, `now_ms` the queues' clock): hold or
        release the replicated queues' dispatch; while lapsed, queues made since are held too. Returns
        OwnerLease.review's answer."""
        if self.lease.lapsed and self.fencing():
            change = None  # contact or not: the lost groups are held first (the protocol's tick, before this)
        else:
            change = self.lease.review(monotonic_ms)
        if change is None and not self.lease.lapsed:
            return None
        broker_effects: list = []
        for queue in self.broker.queues.values():
            if replicated(queue.settings, self.replication_factor_default):
                queue.hold_dispatch(self.lease.lapsed)
                if change is False:
                    queue.tick(now_ms, broker_effects)  # deliver what waited
        if broker_effects:
            self.context.broker_effects(broker_effects, effects)
        return change
