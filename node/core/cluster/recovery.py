"""Recovery: what the journal gave back before the engine loop runs, put back where it belongs: the
seq reservation, the owner's marks, the queue definitions' revision, outbound channels and parks.

Rules:
- Runs before any client or peer: nothing here sends, proposes or delivers; the node's next seq goes
  above every seq recovered, so none is given twice.
- Outbound messages go back in their channels in seq order (one channel may span several journal
  names, one per queue: merged, not sorted all together); those recovered without a body are read back
  from the journal when their turn comes (node/core/cluster/outbound.py). Each recovered list or backlog is
  emptied as it is taken, so a message's record and what it was recovered from are not both held for
  every message at once (a 1,000,000-message backlog would otherwise peak well above what it leaves).
- What was recovered for an owner counts as owed (handover.py `paid`): perhaps a handover or a relay
  before the restart.
- Imports context, forwarding and parking of this package.
"""

from __future__ import annotations

import heapq
import itertools

from node.core.cluster.context import MARK_PREFIX, PARK_PREFIX, QUEUES_MARK, SEQ_RESERVATION
from node.core.cluster.forwarding import Forwarding
from node.core.cluster.parking import Parking
from node.core.dispatch.message import Message
from node.core.cluster.outbound import Entry, entry_of, parse_outbound_name
from node.core.cluster.routing import Inbound

# entries of a bodiless backlog cut off its arrays at once as recovery takes them (see _taken_bodiless)
RECOVERY_CHUNK_ENTRIES = 4096


def recover_declaration(values: dict, forwarding: Forwarding, inbound: Inbound, definitions) -> bool:
    """Take a journalled declaration that is the cluster's own; False for a queue's."""
    name = values["name"]
    if name == SEQ_RESERVATION:
        forwarding.seq_reserved = forwarding.reserved_durable = int(values["reserved"])
        broker = forwarding.broker
        broker.next_seq = max(broker.next_seq, forwarding.seq_reserved)
        return True
    if name == QUEUES_MARK:
        definitions.definitions_applied = int(values["revision"])
        return True
    if name.startswith(MARK_PREFIX):
        source, high_water = name[len(MARK_PREFIX):], int(values["high_water"])
        inbound.advance(source, high_water)
        return True
    return False


def recover_outbound(messages_by_name: dict, forwarding: Forwarding, parking: Parking) -> int:
    """Put journalled outbound and parked messages back. Per journal name: a list of Messages (parked
    ones, and outbound ones with or without a body), or, for outbound names, the journal's bodiless
    backlog (node/store/journal.py BodilessBacklog: parallel `seqs`, `group_ids` and `size_bytes`,
    ascending), which costs no Message per entry. Returns how many outbound messages it put back."""
    runs = []
    for name, recovered in messages_by_name.items():
        if name.startswith(PARK_PREFIX):
            parking.recover(name[len(PARK_PREFIX):], recovered)
            continue
        if type(recovered) is not list:
            runs.append(_taken_bodiless(recovered, *parse_outbound_name(name), name))
            continue
        if any(earlier.seq > later.seq for earlier, later in itertools.pairwise(recovered)):
            recovered.sort(key=_seq_of_message)  # the journal gives each name's in seq order
        runs.append(_taken(recovered, *parse_outbound_name(name), name))
    broker, outbound, recovered_top = forwarding.broker, forwarding.outbound, forwarding.recovered_top
    ready: dict[str, list[Entry | int]] = {}
    count = 0
    for seq, owner, queue, name, group_id, size_bytes, message in heapq.merge(*runs):
        count += 1
        broker.next_seq = max(broker.next_seq, seq + 1)
        known = broker.queues.get(queue)
        route_key = known.route_key(group_id) if known is not None else group_id
        outbound.add(owner, seq, (queue, route_key), name, size_bytes)
        # a message recovered without its body (runtime keeps them in the journal) is paged already
        ready.setdefault(owner, []).append(entry_of(queue, message) if message is not None else seq)
        # perhaps a handover or a relay before a restart: owed until acknowledged
        recovered_top[owner] = max(recovered_top.get(owner, 0), seq)
    for owner in list(ready):  # past the memory budget, paged again
        outbound.ready(owner, ready.pop(owner), forwarding.recovered)
    return count


def _seq_of_message(message: Message) -> int:
    return message.seq


def _taken(messages: list, owner: str, queue: str, name: str):
    """`messages` (in seq order) as (seq, owner, queue, name, group id, size, message or None when it has
    no body), each let go of by the list as it is taken, and the list left empty; seqs are unique across
    a node, so the merge never compares on."""
    for index, message in enumerate(messages):
        messages[index] = None
        yield (message.seq, owner, queue, name, message.group_id, message.size_bytes,
               message if message.payload is not None else None)
    messages.clear()


def _taken_bodiless(backlog, owner: str, queue: str, name: str):
    """A journal's bodiless backlog (parallel seqs, group ids, sizes; in seq order) as _taken's tuples,
    and the backlog left empty. Its arrays shrink as they are taken, a chunk at a time, or they would
    all be held until the last record is made, on top of every record (24 bytes an entry): reversed in
    place first, each chunk is cut off their ends."""
    columns = seqs, group_ids, size_bytes = backlog.seqs, backlog.group_ids, backlog.size_bytes
    for column in columns:
        column.reverse()
    while seqs:
        end = len(seqs)
        start = max(0, end - RECOVERY_CHUNK_ENTRIES)
        for index in range(end - 1, start - 1, -1):
            yield seqs[index], owner, queue, name, group_ids[index], size_bytes[index], None
        for column in columns:
            del column[start:]
