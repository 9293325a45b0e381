"""Status: what the cluster protocol reports to an operator (grouper cluster status, /metrics) and what
it counts as accepted but in no queue yet.

Rules:
- Reads only: nothing here changes the protocol's state or returns effects.
- A move's report spells out, for an operator, what keeps this node from clearing it: the conditions
  of handover.py `drive`, in words.
- Imports no module of this package: the facade (protocol.py) hands itself over, and its concerns with it.
"""

from __future__ import annotations

import collections

MOVES_SHOWN_MAX = 20  # moves status() details (what each waits for here), the oldest keys first
MOVED_COUNTS = ("messages_handed_over", "cold_handed_over", "messages_relayed", "messages_parked",
                "restored_handed_over")


def in_transit(protocol) -> dict[str, int]:
    """Messages accepted here that no queue holds yet, per queue (no zeros): to forward (until their
    owner acknowledges them), waiting for a route, or parked behind a move."""
    counts: collections.Counter = collections.Counter()
    for key_counts in protocol.outbound.key_counts.values():
        for key, count in key_counts.items():
            counts[key[0]] += count
    for key, items in protocol.router.waiting.items():
        counts[key[0]] += len(items)
    for key, messages in protocol.parked.items():
        counts[key[0]] += len(messages)
    return {queue: count for queue, count in sorted(counts.items()) if count}


def status(protocol) -> dict:
    forwarding, counts = protocol.forwarding, protocol.counts
    return {
        "routes": len(protocol.router.routes),
        "waiting_for_route": protocol.router.waiting_count(),
        "outbound": forwarding.outbound.depths(),
        "outbound_store": forwarding.outbound.stats(),  # per owner: messages and bytes, in memory and journalled
        "outbound_refused": dict(sorted(forwarding.outbound_refused.items())),
        "forward_marks_set_back": counts["forward_marks_set_back"],  # see owner.py
        "outbound_max_bytes": forwarding.outbound_max_bytes,
        "outbound_total_max_bytes": forwarding.outbound_total_max_bytes,
        "outbound_max_messages": forwarding.outbound_max_messages,
        "outbound_memory_max_bytes": forwarding.outbound.memory_max_bytes,
        "moving": len(protocol.moves),
        "moves": [move_report(protocol, key, move)
                  for key, move in sorted(protocol.moves.items())[:MOVES_SHOWN_MAX]],
        "held": len(protocol.held),
        "parked": sum(len(messages) for messages in protocol.parked.values()),
        # messages that left or waited for a move since this node started, by how
        "moved": {how: counts[how] for how in MOVED_COUNTS},
        "cold_sweeps": counts["cold_sweeps"],
        "in_transit": in_transit(protocol),
        "members": protocol.members,
    }


def move_report(protocol, key: tuple[str, str], move: tuple) -> dict:
    """What move `key` waits for, as this node sees it: the members yet to clear, and what keeps this
    one from clearing (handover.py `drive`'s conditions, spelled out for an operator)."""
    from_node, to_node, waiting = move
    me, handovers = protocol.node_id, protocol.handovers
    outbound = protocol.forwarding.outbound
    blocks = []
    if me in waiting:
        if not protocol.router.ready:
            blocks.append("this node's replica is not current yet")
        if from_node == me:
            if waiting != {me}:
                blocks.append("the other members' clears (the old owner clears last)")
            if handovers.context.warm_here(key):
                queue = protocol.broker.queues[key[0]]
                group_key = queue.group_key_of_route(key[1])
                blocks.append(f"{queue.group_available(group_key)} queued and "
                              f"{queue.group_in_flight(group_key)} in flight here")
            if handovers.sweeps.pending(key):
                blocks.append("a sweep of the queue's cold tail"
                              + (" (reading)" if key[0] in handovers.sweeps.sweeps else " (not started)"))
            if key in protocol.parked:
                parked = protocol.parked[key]
                blocks.append(f"{len(parked)} parked here, relayed once nothing else of the group is left here"
                              + ("; the first is not known on disk yet"
                                 if parked[0].seq in handovers.parking.unsure else ""))
            if not handovers.paid(key, to_node):
                channel = outbound.channels.get(to_node)
                blocks.append(f"{to_node} to acknowledge forward seq {handovers.owed.get(key, 0)} (recovered up "
                              f"to {protocol.forwarding.recovered_top.get(to_node, 0)}; its channel starts at "
                              f"{next(iter(channel)) if channel else None})")
        elif count := outbound.count(from_node, key):
            blocks.append(f"{from_node} to acknowledge messages of the group forwarded to it ({count} left)")
    return {"queue": key[0], "group": key[1], "from": from_node, "to": to_node, "waiting": sorted(waiting),
            "here": blocks}
