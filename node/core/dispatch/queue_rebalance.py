"""Incremental rebalance (issue 30, `group_rebalance_mode = "incremental"`): when a consumer joins, move only
the surplus groups of the most loaded consumers to it, as few as make the counts even within one. Pure.

Rules this module keeps:
- The plan is counts only (`even_targets`): N groups assigned over k acquiring consumers (the newcomer
  included) end at floor(N/k) or ceil(N/k) each; the N mod k consumers holding most keep ceil (ties: the
  newcomer, then the earlier attached). A donor gives `count - target`, a receiver (the newcomer, and any other consumer below
  its target) takes `target - count`. That is the fewest moves that make the counts even within one: every
  group above a consumer's target must leave it, and no other moves. (10,000 groups over 10 consumers, an
  11th joining: 909 move, where a reset moves all 10,000.)
- Which groups move: from each donor, first the groups with nothing in flight, the last assigned first (the
  longest-held stay with their consumer's caches). Those move at once, straight to the receiver: nothing of
  them is unsettled anywhere, so no order can break, and no pause is needed. Only when a donor lacks them,
  groups with deliveries in flight move, as a reset does: with group_rebalance_pause_dispatch each is PAUSED
  (still the donor's, dispatching nothing) until its in-flight messages settle, then free, and taken by the
  taker with the fewest groups (the receiver, which is short of it); without the pause it moves at once (the
  documented risk of a rebalance without pause: two consumers may hold messages of one group).
- No group that is not moved changes consumer or pauses. A group already PAUSED (closing, or let go by a
  selector) is leaving its consumer anyway and is never moved.
- Consumers with a JMS selector neither give nor take: the groups they hold follow what they select
  (node/core/dispatch/selector_dispatch.py). A newcomer with a selector moves nothing.
- A receiver's first message of a moved group is flagged first-for-consumer (group_first_key), as after a
  reset: the group is listed in the receiver's `moved_in` until that message goes out.
- Cost: one pass over the donors' assigned lists, once per join; a reset passes over every group.
"""

from __future__ import annotations

from node.core.dispatch.queue_consumers import Consumer, Consumers
from node.core.dispatch.queue_groups import GroupTable
from node.core.dispatch.queue_lanes import PAUSED, Group


def even_targets(counts: list[tuple[object, int]]) -> dict:
    """`counts`: (member, groups it holds) in attach order. Returns member -> the count it should hold:
    floor or ceil of the mean, ceil for those holding most, so that the fewest groups move."""
    total = sum(count for _, count in counts)
    base, extra = divmod(total, len(counts))
    ranked = sorted(range(len(counts)), key=lambda index: (-counts[index][1], index))
    return {counts[index][0]: base + (rank < extra) for rank, index in enumerate(ranked)}


def rebalance_incremental(groups: GroupTable, consumers: Consumers, newcomer: Consumer, pause: bool) -> int:
    """Move the surplus groups of the most loaded consumers to `newcomer` (and any other consumer below
    its even share); returns how many groups move (the paused ones included)."""
    if newcomer.selector is not None:
        return 0
    members = [c for c in consumers.by_id.values() if not c.browse and c.selector is None]
    if len(members) < 2:
        return 0
    members.sort(key=lambda member: member is not newcomer)  # a tie for ceil goes to the newcomer first
    targets = even_targets([(member, member.assigned_count) for member in members])
    receivers = [member for member in members if targets[member] > member.assigned_count]
    rooms = [targets[member] - member.assigned_count for member in receivers]
    at = 0
    moved = 0
    for donor in members:
        surplus = donor.assigned_count - targets[donor]
        if surplus <= 0:
            continue
        for group in _leaving(donor, surplus):
            while rooms[at] == 0:
                at += 1
            rooms[at] -= 1
            moved += 1
            if group.acquired and pause:
                group.placed = PAUSED  # Settlement.after_settle frees it once settled; its heap entry is stale
                continue
            donor.unassign(group)
            receiver = receivers[at]
            receiver.assign(group)
            receiver.moved_in.add(group)
            groups.place_or_forget(group)  # into the receiver's heap when it has a head
    return moved


def _leaving(donor: Consumer, count: int) -> list[Group]:
    """The donor's `count` groups that move: nothing in flight first, the last assigned first."""
    held = [group for group in reversed(donor.assigned_groups()) if group.placed is not PAUSED]
    settled = [group for group in held if not group.acquired]
    if len(settled) >= count:
        return settled[:count]
    return settled + [group for group in held if group.acquired][:count - len(settled)]
