"""Clients for runs of many distinct groups: a lean producer whose every message opens a group of its
own (its group ids made as it sends, so millions need not sit in a list) and publishes its counts to
the parent through a shared array, and lean consumers that only count what they receive. Used by
bench/route_lifecycle.py (routes made and reaped) and bench/paging.py (paged drains); each runs in a
forked process and records nothing per message."""

from __future__ import annotations

from bench import clients, lean

PREFETCH = 1000  # credit per consumer: deliveries are accepted on arrival, so this only smooths flow
STALL_S = 120.0  # no producer sent or settled anything for this long: the run stops as failed


class GroupNames:
    """group ids `<prefix><number>`, made when sent: millions of names need not sit in a list."""

    def __init__(self, prefix: str):
        self.prefix = prefix

    def __getitem__(self, number: int) -> str:
        return f"{self.prefix}{number}"


class FirstOfGroup:
    """Every message is its group's first (sequence number 0)."""

    def __getitem__(self, number: int) -> int:
        return 0


class DistinctGroupsProducer(lean.Producer):
    """The lean producer, each message in a group of its own; publishes its counts to the parent."""

    def __init__(self, target, workload, prefix: str, counts, slot: int):
        super().__init__(target, workload)
        self.groups, self.seqs = GroupNames(prefix), FirstOfGroup()
        self.counts, self.slot = counts, slot

    def _send_due(self, start_ns: int) -> None:
        super()._send_due(start_ns)
        base = self.slot * 3
        self.counts[base], self.counts[base + 1] = self.sent, self.accepted
        self.counts[base + 2] = self.rejected + self.released + self.modified


def produce(target, workload, prefix: str, counts, slot: int, go, result_path: str) -> None:
    result = {"sent": 0, "accepted": 0, "rejected": 0, "released": 0, "error": ""}
    sender = None
    try:
        sender = DistinctGroupsProducer(target, workload, prefix, counts, slot)
        sender.wait_attached(clients.READY_TIMEOUT_S)
        go.wait()
        sender.run(STALL_S)
        result.update(sender.result())
    except Exception as error:  # recorded, not raised: a benchmark reports failures
        result["error"] = f"{type(error).__name__}: {error}"
    if sender is not None:
        base = slot * 3
        counts[base], counts[base + 1] = sender.sent, sender.accepted
        counts[base + 2] = sender.rejected + sender.released + sender.modified
        sender.pump.close_all()
    clients._dump(result_path, result)


class CountingConsumers(lean.Consumers):
    """lean's consumers without the per-message record: millions of deliveries, only counted."""

    def _message(self, consumer, payload: bytes) -> None:
        consumer.count += 1


def consume(target, index: int, ready, stop, received) -> None:
    group = CountingConsumers(target, [index], PREFETCH)
    lean._attach(group, {index: ready}, clients.READY_TIMEOUT_S)
    consumer = group.consumers[0]
    while not stop.is_set():
        group.pass_once(lean.SELECT_TIMEOUT_S)
        received[index] = consumer.count
    group.pump.close_all()
