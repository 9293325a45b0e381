"""The ReplicaBatch on the wire (proto/peer.proto, issue 28), both ends: records to a batch, a batch back to
records.

Rules:
- The owner builds a batch with `batch_to_pb`; the backup's servicer (node/peer/service.py) reads one with
  `records_from_pb`, which checks its shape (owner_node set, repl_seq >= 1 and strictly increasing, a
  group id only with has_group) and every frame (node/store/replica_journal.py replica_record: a whole
  STORE or REMOVE of the entry's queue and group), naming the entry, so the replica writer only ever
  sees a well-formed batch; epochs, resends and gaps are the replica journal's to judge.
- A batch in a format version this build does not read is refused (NotAllowed, FAILED_PRECONDITION):
  the owner keeps it and resends once the backup is upgraded.
- Pure translation: no threads, no I/O.
"""

from __future__ import annotations

from node.core.errors import InvalidField, NotAllowed
from node.store.replica_journal import ReplicaRecord, replica_record
from proto import peer_pb2

# ReplicaBatch.format_version: what this build sends, and what its backup's end reads
FORMAT_VERSION = 1
FORMAT_VERSIONS_READ = (1,)
REPL_SEQ_LIMIT = 1 << 63  # a stream's seqs are signed 64-bit, as every seq of the node's


def batch_to_pb(owner_node: str, epoch: int, entries, reset: bool = False) -> peer_pb2.ReplicaBatch:
    """`entries`: (repl_seq, queue, group id or None, frame) each; `reset`: a new stream incarnation."""
    batch = peer_pb2.ReplicaBatch(owner_node=owner_node, epoch=epoch, format_version=FORMAT_VERSION, reset=reset)
    add = batch.entries.add
    for repl_seq, queue, group_id, frame in entries:
        add(repl_seq=repl_seq, queue=queue, has_group=group_id is not None, group_id=group_id or "", frame=frame)
    return batch


def records_from_pb(batch: peer_pb2.ReplicaBatch) -> list[ReplicaRecord]:
    """InvalidField naming the field or entry when the batch is malformed; NotAllowed when it is in a
    format version this build does not read."""
    version = batch.format_version or 1  # 0: not said, which is version 1
    if version not in FORMAT_VERSIONS_READ:
        raise NotAllowed(f"replica batch from {batch.owner_node!r} is in peer format version {version}; this node "
                         f"reads {', '.join(map(str, FORMAT_VERSIONS_READ))}: upgrade this node (one version step "
                         f"at a time), it will then take the batch its owner keeps resending")
    if not batch.owner_node:
        raise InvalidField("owner_node: must not be empty")
    made = []
    previous_seq = 0
    for index, entry in enumerate(batch.entries):
        seq = entry.repl_seq
        where = f"entries[{index}] (repl_seq {seq})"
        if not previous_seq < seq < REPL_SEQ_LIMIT:
            expected = "be >= 1" if index == 0 else f"increase (previous {previous_seq})"
            raise InvalidField(f"{where}.repl_seq: must {expected} and stay below {REPL_SEQ_LIMIT}")
        if entry.group_id and not entry.has_group:
            raise InvalidField(f"{where}.group_id: set without has_group (an ungrouped entry names no group)")
        previous_seq = seq
        made.append(replica_record(where, seq, entry.queue, entry.group_id if entry.has_group else None,
                                   entry.frame))
    return made
