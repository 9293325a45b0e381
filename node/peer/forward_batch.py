"""The ForwardBatch on the wire (proto/peer.proto), both ends: entries to a batch, and a batch back to entries.

Rules:
- The sender (node/peer/forwarder.py) builds a batch with `batch_to_pb`; the owner's servicer
  (node/peer/service.py) reads one with `entries_from_pb`, which checks its shape (source_node set,
  at least one message, forward_seq >= 1, strictly increasing, below FORWARD_SEQ_LIMIT and below the
  batch's own seq_bound when it says one), so the engine loop only ever sees a well-formed batch; its
  content (queue names, limits) is the protocol's to judge.
- A batch in a format version this build does not read is refused retriably (NotAllowed): the source
  keeps it and resends, and the owner takes it once upgraded.
- A gRPC message is at most MESSAGE_BYTES_MAX both ways; a batch is capped far below it
  (batch_bytes_max, node/core/cluster/forward_sender.py).
- Pure translation: no threads, no I/O.
"""

from __future__ import annotations

from node.core.errors import InvalidField, NotAllowed
from node.core.cluster.outbound import Entry
from proto import peer_pb2

MESSAGE_BYTES_MAX = 64 << 20  # gRPC frame limit for a batch, both ways; a batch is capped far below
FORWARD_SEQ_LIMIT = 1 << 63  # a source's seqs are signed 64-bit (node/core/cluster/outbound.py): none reaches it

# ForwardBatch.format_version (proto/peer.proto): what this build sends, and what its owner's end reads
# (the one before it too, once there is one, so a cluster upgraded one step at a time keeps forwarding)
FORMAT_VERSION = 1
FORMAT_VERSIONS_READ = (1,)


class SeqJump(InvalidField):
    """A batch's forward seq beyond what its source can have given (INVALID_ARGUMENT, logged)."""


def batch_to_pb(source_node: str, entries: list[Entry], seq_bound: int = 0,
                disputed_high_water: int = 0) -> peer_pb2.ForwardBatch:
    batch = peer_pb2.ForwardBatch(source_node=source_node, format_version=FORMAT_VERSION, seq_bound=seq_bound,
                                  disputed_high_water=disputed_high_water)
    add = batch.messages.add  # builds in place: half the cost of Forwarded(...) then a copy
    for entry in entries:
        add(forward_seq=entry.forward_seq, queue=entry.queue, has_group=entry.group_id is not None,
            group_id=entry.group_id or "", payload=entry.payload, expires_at_ms=entry.expires_at_ms,
            closes_group=entry.closes_group, enqueued_at_ms=entry.enqueued_at_ms, not_durable=entry.not_durable)
    return batch


def entries_from_pb(batch: peer_pb2.ForwardBatch) -> list[Entry]:
    """Raises InvalidField naming the field when the batch is malformed, NotAllowed (FAILED_PRECONDITION:
    the source keeps the batch and retries) when it is in a format version this build does not read."""
    version = batch.format_version or 1  # 0: sent before versions, which is version 1
    if version not in FORMAT_VERSIONS_READ:
        raise NotAllowed(f"forwarded batch from {batch.source_node!r} is in peer format version {version}; "
                         f"this node reads {', '.join(map(str, FORMAT_VERSIONS_READ))}: upgrade this node "
                         f"(one version step at a time), it will then take the batch the source keeps resending")
    if not batch.source_node:
        raise InvalidField("source_node: must not be empty")
    if not batch.messages:
        raise InvalidField("messages: a batch holds at least one message")
    entries = []
    previous_seq = 0
    for index, message in enumerate(batch.messages):
        seq = message.forward_seq
        if seq <= previous_seq:
            expected = "be >= 1" if index == 0 else f"increase (previous {previous_seq})"
            raise InvalidField(f"messages[{index}].forward_seq: must {expected}, got {seq}")
        previous_seq = seq
        # _make, positional in Entry's field order, costs half of Entry(name=...) per message
        entries.append(Entry._make((seq, message.queue, message.group_id if message.has_group else None,
                                    message.payload, message.expires_at_ms, message.closes_group,
                                    message.enqueued_at_ms, message.not_durable)))
    bound = batch.seq_bound or FORWARD_SEQ_LIMIT
    if previous_seq >= bound:  # the last seq is the highest
        raise SeqJump(f"messages[{len(entries) - 1}].forward_seq: {previous_seq} jumps ahead of "
                      + (f"the batch's own seq_bound {bound}: its source never gave that seq"
                         if batch.seq_bound else f"every node seq (they stay below {FORWARD_SEQ_LIMIT})")
                      + "; the batch is refused, and its source's sequence here is unchanged")
    return entries
