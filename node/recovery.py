"""Recovery of one node: its queues and messages read back from the journal before it serves.

Rules:
- Runs on the main thread before the engine loop starts: it owns the broker and the journal until then.
- The journal's cluster records (names starting with NUL) go to the cluster link, or stay in the journal
  on a node that runs alone; nothing in them is dropped.
- Only what the journal does not hold yet is journalled again (new or changed config-file queues).
- `node` is a node.runtime.Node, taken as it comes (runtime imports this module, not back).
"""

from __future__ import annotations

import logging

from node.core.effects import Dropped, ReadRecords
from node.core.cluster.outbound import OUTBOUND_PREFIX
from node.core.dispatch.dedup import DEDUP_PREFIX
from node.core.dispatch.settings import QueueSettings

log = logging.getLogger("grouper.node")


def reserved_name(name: str) -> bool:
    return name.startswith("\x00")  # the cluster's own journal records (queue names cannot hold NUL)


def recover(node) -> None:
    """The node's queues and messages back from its journal (and its configured queues), before it serves."""
    # past the node's budget only records come back; bodies are read when dispatch reaches them (or, for
    # a restored group that lives elsewhere now, when it is handed over). With a record budget, a durable
    # queue's messages come back as a cold tail
    # (node/core/dispatch/cold.py): only counted, read back whole, oldest first, as the budget makes room and
    # dispatch needs them
    cold = node.broker.records.max_bytes > 0
    # the outbound store's bodies stay in the journal: it pages past its budget and reads back as owners
    # take their backlogs (node/core/cluster/outbound.py), so a restart never loads a dead owner's backlog whole
    bodiless = OUTBOUND_PREFIX if node.cluster is not None and node.config.outbound_memory_max_bytes else ""
    recovery = node.journal.recover(node.config.message_memory_max_bytes, cold=cold,
                                    bodiless_prefix=bodiless)
    for settings in node.config.queues:
        node.broker.declare_queue(settings)
    journalled = set()
    for values in recovery.queues:
        if reserved_name(values["name"]):
            if node.cluster is None or not node.cluster.recover_declaration(values):
                log.warning("journal holds cluster record %r but this node runs alone; keeping it", values["name"])
            continue
        settings = QueueSettings.from_dict(values, where=f"journal queue {values.get('name')!r}")
        journalled.add(settings)
        if settings.name not in node.broker.queues:
            node.broker.declare_queue(settings)
    # journal only what the journal does not hold yet: new or changed config-file queues
    node.broker.forget_declared(journalled)
    restored = 0
    recover_dedup_marks(node, recovery.messages)
    outbound = {name: messages for name, messages in recovery.messages.items() if reserved_name(name)}
    if outbound and node.cluster is not None:
        log.info("recovered %d messages waiting to be forwarded", node.cluster.recover_outbound(outbound))
    elif outbound:
        log.warning("journal holds %d messages waiting for other nodes, but this node runs alone (no "
                    "peers); they stay in the journal until it rejoins its cluster",
                    sum(len(messages) for messages in outbound.values()))
    for name, messages in recovery.messages.items():
        if reserved_name(name):
            continue
        if name not in node.broker.queues:
            log.warning("journal holds %d messages of undeclared queue %r; declaring it from the address settings",
                        len(messages), name)
            node.broker.queue(name, create=True)
        for message in messages:
            node.broker.restore(name, message)
            restored += 1
    for name, backlog in recovery.cold.items():
        if name not in node.broker.queues:
            log.warning("journal holds %d messages of undeclared queue %r; declaring it from the address settings",
                        len(backlog.seqs), name)
            node.broker.queue(name, create=True)
        node.broker.restore_cold(name, backlog.seqs, backlog.size_bytes)
        restored += len(backlog.seqs)
    if node.cluster is not None:
        node.cluster.hold_recovered()  # with route_follow_ms: until the replica is current
    if cold:
        read_cold_back(node)
    node.broker.page_out(node.clock_ms())  # the budgets; held groups keep their bodies (paging.py)
    log.info("recovered %d queues and %d messages from %s", len(node.broker.queues), restored,
             node.config.data_dir)

def recover_dedup_marks(node, messages: dict) -> None:
    """Issue 31: the de-duplication marks (node/core/dispatch/dedup.py) back into their queues' windows, taken
    out of `messages` (they are no cluster records). Marks of a queue gone or no longer de-duplicating are
    deleted from the journal."""
    now_ms = node.clock_ms()
    for name in [name for name in messages if name.startswith(DEDUP_PREFIX)]:
        marks = messages.pop(name)
        queue = node.broker.queues.get(name[len(DEDUP_PREFIX):])
        if queue is None or not queue.settings.dedup or not queue.settings.durable:
            node.journal.delete(name)
            continue
        for effect in node.broker.dedup.restore(queue.settings, marks, now_ms):  # REMOVEs of marks aged out
            node.journal.remove(effect.queue, effect.seq)
        log.info("queue %r: %d de-duplication marks recovered", queue.settings.name,
                 len(node.broker.dedup.windows[queue.settings.name]))


def read_cold_back(node) -> None:
    """Before serving, read each recovered cold tail's oldest records back as far as the record budget
    goes, as dispatch would (node/core/dispatch/cold.py): a restarted node serves its warm part at once."""
    now_ms = node.clock_ms()
    reads = [ReadRecords(name, queue.cold.after_seq, count, queue.cold.read_max_bytes)
             for name, queue in sorted(node.broker.queues.items())
             if queue.cold is not None and (count := queue.cold.ask(False))]
    while reads:
        read = reads.pop(0)
        records = node.journal.read_records_after_now(read.queue, read.after_seq, read.count, read.max_bytes)
        if node.cluster is not None:
            node.cluster.cold_records(read.queue, records)  # holds what may live elsewhere, as recovery does
        for effect in node.broker.promote(read.queue, records, now_ms):
            if type(effect) is ReadRecords:
                reads.append(effect)  # the next batch, while the budget has room
            elif type(effect) is Dropped:
                log.error("queue %r: message %d dropped at recovery: %s", effect.queue, effect.seq, effect.reason)
            else:  # with no consumer attached yet, promotion asks for nothing else
                raise AssertionError(f"recovery's read-back of cold records made {effect!r}")
