"""Group-level signals of one queue (issue 30): how many groups could use another consumer now, how many
wait, how many have a consumer, and since when the oldest head waits. Pure: no clock; the head's arrival
time is given, its age is the reader's `now - at`.

The signals, each a count of groups:
- runnable: its next message is available and no consumer has the group: a consumer with credit would get
  it at once. This is the honest ceiling on useful new consumers (what an autoscaler reads).
- blocked: its next message is available but waits: held by a consumer that may take nothing now (no
  credit, or at its unsettled cap), PAUSED (a rebalance or reset waits for its in-flight messages, or the
  group is closing), held for the cluster (a move), waiting out a redelivery delay, or stranded (no
  attached consumer's selector selects it).
- held: the group has a consumer (the figure `owned_groups` gives too).
A group with a consumer that may take now is held and neither runnable nor blocked: the next dispatch
sends its head. `oldest_head_enqueued_at_ms` is the arrival time of the oldest available message at the
head of a group found below or of the ungrouped lane (0: none), on the broker's clock (wall clock ms).

Cost, per stats call only (a /metrics scrape, `grouper queue list`); nothing per message, and dispatch pays
nothing. Groups that wait are found where dispatch keeps them, never by a pass over the group table:
the heaps (live and not yet dropped stale entries), the consumers' unsettled deliveries (paused groups),
the redelivery delays, the cluster's holds and the stranded groups; `held` sums the consumers' counts.
So the cost is proportional to the groups that have a message waiting, not to the groups tracked: an
exclusive queue's million idle groups kept by their consumers cost nothing. Measured on this machine (a
2-core VM shared with other work): ~0.2 s per million waiting groups (tests/unit/test_group_signals.py
prints it), against ~0.36 s for a pass over every group. Not counted: a group whose head's body is being
read back from the journal (for milliseconds, out of every heap).
"""

from __future__ import annotations

from node.core.dispatch.message import AVAILABLE, STATE_MASK
from node.core.dispatch.queue_lanes import PAUSED


def group_signals(table, consumers, delayed: list) -> dict:
    """`table`: the queue's GroupTable; `consumers`: its Consumers; `delayed`: its redelivery-delay heap."""
    oldest_ms = 0
    runnable = 0
    for entry in table.unassigned:
        group = entry[1]
        if group.placed is entry:  # the group's live entry: in no consumer's hands, its head ready
            runnable += 1
            oldest_ms = _older(oldest_ms, group.head())
    blocked = held = 0
    waiting: set = set()  # groups out of every heap whose head waits (disjoint from the heaps' live entries)
    for consumer in consumers.by_id.values():
        if consumer.browse:
            continue
        held += consumer.assigned_count
        busy = not consumer.may_take
        for entry in consumer.ready:
            group = entry[1]
            if group.placed is entry:
                blocked += busy
                oldest_ms = _older(oldest_ms, group.head())
        for message in consumer.unsettled.values():
            if message.group is not None and message.group.placed is PAUSED:
                waiting.add(message.group)
    for _, _, message in delayed:
        if message.group is not None and message.flags & STATE_MASK == AVAILABLE:
            waiting.add(message.group)
    groups = table.groups
    for key in table.held_keys:
        if key in groups:
            waiting.add(groups[key])
    if consumers.selection is not None:
        waiting.update(consumers.selection.stranded)
    for group in waiting:
        head = group.head()
        if head is not None and groups.get(group.key) is group and type(group.placed) is not tuple:
            blocked += 1
            oldest_ms = _older(oldest_ms, head)
    ungrouped = table.ungrouped
    if ungrouped:
        oldest_ms = _older(oldest_ms, next((m for m in ungrouped if m.flags & STATE_MASK == AVAILABLE), None))
    return {"owned_groups": held, "runnable_groups": runnable, "blocked_groups": blocked, "held_groups": held,
            "oldest_head_enqueued_at_ms": oldest_ms}


def _older(oldest_ms: int, head) -> int:
    if head is None or not head.enqueued_at_ms:
        return oldest_ms
    return head.enqueued_at_ms if not oldest_ms or head.enqueued_at_ms < oldest_ms else oldest_ms
