"""The engine loop's side of delivery traces: what a traced queue's sends, deliveries and settlements say.

Engine loop thread only. It turns the loop's events into trace lines of the kinds `grouper audit` reads
(pipeline/audit.py; README "Auditing deliveries") and hands them to the trace writer (node/store/trace.py)
once per batch; it never touches a file. Rules:
- Only traced queues (settings.trace) cost anything: the loop asks `traced(queue)` first, and only then
  is the message's identity (application properties "producer" and "sequence") read from its bytes.
- A send line is written where the producer is attached, when the node settles the send (its outcome is
  the node's decision, stamped then; a multicast send: one per traced subscription queue, all with the
  send's one outcome); an enqueue line where the message enters its queue (a forwarded
  message: at the group's node); delivery lines where the consumer is attached, once their fate is known:
  the consumer's outcome (a removal waiting for the journal: once it is on disk, or `settle_confirmed`
  false if the write failed), or "dropped" when the link ends first.
- Times are this node's clock_ms: a delivery's received_ms is when the node sent it, settled_ms when the
  consumer's outcome reached the node, so a node's hold interval holds the client's.
- Lines are plain dicts; the writer thread encodes them.
"""

from __future__ import annotations

from node.amqp import codec

OUTCOME_DROPPED = "dropped"  # the link ended before the consumer chose an outcome: the node gave it back


class Tracer:
    def __init__(self, node_id: str, broker, writer, clock_ms):
        self.node_id = node_id
        self.broker = broker
        self.writer = writer  # node.store.trace.TraceWriter, or None: traces are written nowhere (tests)
        self.clock_ms = clock_ms
        self.lines: list[dict] = []  # this batch's lines, for the writer
        # proton delivery pointer of a traced send -> its lines (one per traced copy of a multicast send)
        self.sends: dict = {}
        self.deliveries: dict[int, dict] = {}  # consumer id -> {proton delivery pointer: line}, until settled
        self._consumers: dict[int, str] = {}  # consumer id -> queue, for the traced queues' consumers

    def traced(self, queue_name: str) -> bool:
        queue = self.broker.queues.get(queue_name)
        return queue is not None and queue.settings.trace

    def flush(self) -> None:
        """The end of a batch: hand its lines to the writer."""
        lines, self.lines = self.lines, []
        if self.writer is not None:
            self.writer.submit(lines)

    # ---- producers -----------------------------------------------------------------------------

    def send_arrived(self, delivery, queue: str, group: str | None, payload: bytes, now_ms: int) -> None:
        producer, sequence = codec.read_trace_identity(payload)
        self.sends.setdefault(delivery, []).append({
            "kind": "send", "producer": producer, "node": self.node_id, "queue": queue, "group": group,
            "sequence": sequence, "sent_ms": now_ms})

    def send_settled(self, delivery, condition: tuple | None) -> None:
        lines = self.sends.pop(delivery, ())
        settled_ms = self.clock_ms() if lines else 0
        for line in lines:
            line["settled_ms"] = settled_ms
            if condition is None:
                line.update(outcome="accepted", condition=None)
            else:
                line.update(outcome="rejected", condition=condition[0], description=condition[1])
            self.lines.append(line)

    def enqueued(self, queue: str, message) -> None:
        producer, sequence = codec.read_trace_identity(message.payload)
        self.lines.append({"kind": "enqueue", "node": self.node_id, "queue": queue, "group": message.group_id,
                           "producer": producer, "sequence": sequence, "at_ms": self.clock_ms()})

    # ---- consumers -----------------------------------------------------------------------------

    def attached(self, consumer_id: int, label: str, queue: str) -> None:
        self._consumers[consumer_id] = queue
        self.lines.append({"kind": "attach", "consumer": label, "node": self.node_id, "queue": queue,
                           "at_ms": self.clock_ms()})

    def delivered(self, consumer_id: int, label: str, delivery, queue: str, message, settled: bool) -> None:
        producer, sequence = codec.read_trace_identity(message.payload)
        now_ms = self.clock_ms()
        line = {"kind": "delivery", "consumer": label, "node": self.node_id, "queue": queue,
                "group": message.group_id, "producer": producer, "sequence": sequence, "received_ms": now_ms,
                "delivery_count": message.delivery_count}
        if settled:  # a presettled link: accepted as it leaves
            self.lines.append({**line, "settled_ms": now_ms, "confirmed_ms": now_ms, "outcome": "accepted",
                               "settle_confirmed": True})
        else:
            self.deliveries.setdefault(consumer_id, {})[delivery] = line

    def delivery_settled(self, consumer_id: int, delivery, outcome: str, on_disk_later: bool) -> None:
        """The consumer's outcome reached the node; `on_disk_later`: the node settles once the removal is
        on disk (`delivery_confirmed` follows)."""
        pending = self.deliveries.get(consumer_id)
        line = pending.get(delivery) if pending else None
        if line is None:
            return
        line["settled_ms"] = self.clock_ms()
        line["outcome"] = outcome
        if not on_disk_later:
            del pending[delivery]
            self._write_delivery(line, True)

    def delivery_confirmed(self, consumer_id: int, delivery, confirmed: bool) -> None:
        pending = self.deliveries.get(consumer_id)
        line = pending.pop(delivery, None) if pending else None
        if line is not None:
            self._write_delivery(line, confirmed)

    def detached(self, consumer_id: int, label: str, condition: str | None = None) -> None:
        """The consumer's link ended: what it held without an outcome was given back (dropped); an
        acceptance still waiting for the disk was never settled to it."""
        queue = self._consumers.pop(consumer_id, None)
        pending = self.deliveries.pop(consumer_id, None)
        now_ms = self.clock_ms()
        for line in (pending or {}).values():
            if "outcome" in line:
                self._write_delivery(line, False)
            else:
                self._write_delivery({**line, "settled_ms": now_ms, "outcome": OUTCOME_DROPPED}, False)
        if queue is not None:
            self.lines.append({"kind": "detach", "consumer": label, "node": self.node_id, "queue": queue,
                               "at_ms": now_ms, "condition": condition})

    def _write_delivery(self, line: dict, confirmed: bool) -> None:
        line["confirmed_ms"] = self.clock_ms() if confirmed else None
        line["settle_confirmed"] = confirmed
        self.lines.append(line)
