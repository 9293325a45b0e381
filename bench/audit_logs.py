"""The audit benchmark's generated logs: drill-like send, delivery and event logs of any size, written
by forked worker processes, and the losses and consumer changes planted in them.

The generated workload, derived from the message index i alone so worker processes write their share
without talking: GROUPS groups over PRODUCERS producers (producer = group mod PRODUCERS, queue =
producer mod 2), message i goes to group i mod GROUPS with sequence i div GROUPS + 1, sent at
i div SEND_RATE_PER_MS ms (plus RESTART_PAUSE_MS per shift before it), received 1-40 ms later, settled
0-6 ms after that. A group sticks to one of CONSUMERS_PER_QUEUE consumers of its queue; SHIFTS times
a run, evenly spaced, the sends pause, every consumer detaches and attaches again (a node restart)
and each group moves to the next consumer, so the audit must find GROUPS x SHIFTS consumer changes,
every one "consumer_gone". One message in LOST_EVERY is sent and never delivered (lost).
It runs no audit: bench/audit.py runs `grouper audit` on what this module writes.
"""

from __future__ import annotations

import json
import multiprocessing
import time
from pathlib import Path

GROUPS = 20_000
PRODUCERS = 4
CONSUMERS_PER_QUEUE = 4
SEND_RATE_PER_MS = 20  # 20,000 messages/s: a group sees one message a second
SHIFTS = 4  # per run: every group changes consumer 4 times, whatever the size
RESTART_PAUSE_MS = 100  # sends pause this long at a shift: the old consumers finish, detach, and attach again
LOST_EVERY = 100_003
START_MS = 1_795_000_000_000
WRITERS = 2  # generator processes, one per core
BUFFER_LINES = 20_000
MEMORY_SAMPLE_INTERVAL_S = 0.5
AUDIT_TIMEOUT_S = 4 * 3600.0
FREE_DISK_MARGIN = 1.3  # the generated logs plus Spark's spill must fit with this much to spare
DELIVERY_LINE_BYTES = 250  # about, for the disk check
SEND_LINE_BYTES = 190


def _shift_every(deliveries: int) -> int:
    return max(1, deliveries // (SHIFTS + 1))


def _shift(index: int, shift_every: int) -> int:
    return min(index // shift_every, SHIFTS)


def _consumer(queue: int, group: int, shift: int) -> str:
    return f"q{queue}c{(group // PRODUCERS + shift) % CONSUMERS_PER_QUEUE}"


def _write_share(directory: str, writer: int, deliveries: int) -> int:
    """Writer w writes messages w, w + WRITERS, ...: its own send and delivery files. Returns lines written."""
    sends = open(Path(directory) / f"sends-{writer}.jsonl", "w", buffering=1 << 20)
    received = open(Path(directory) / f"deliveries-{writer}.jsonl", "w", buffering=1 << 20)
    send_lines, delivery_lines, written = [], [], 0
    shift_every = _shift_every(deliveries)
    for index in range(writer, deliveries, WRITERS):
        group = index % GROUPS
        producer = group % PRODUCERS
        queue = producer % 2
        sequence = index // GROUPS + 1
        shift = _shift(index, shift_every)
        sent_ms = START_MS + index // SEND_RATE_PER_MS + shift * RESTART_PAUSE_MS
        send_lines.append(
            f'{{"kind":"send","producer":"p{producer}","node":"amqp://127.0.0.1:5672","queue":"q{queue}",'
            f'"group":"g{group}","sequence":{sequence},"sent_ms":{sent_ms},"settled_ms":{sent_ms + 2},'
            f'"outcome":"accepted","condition":null}}\n')
        if index % LOST_EVERY != LOST_EVERY - 1:
            received_ms = sent_ms + 1 + (index * 2654435761 >> 8) % 40
            settled_ms = received_ms + index % 7
            delivery_lines.append(
                f'{{"kind":"delivery","consumer":"{_consumer(queue, group, shift)}","node":"amqp://127.0.0.1:5672",'
                f'"queue":"q{queue}","group":"g{group}","producer":"p{producer}","sequence":{sequence},'
                f'"received_ms":{received_ms},"settled_ms":{settled_ms},"confirmed_ms":{settled_ms + 1},'
                f'"delivery_count":0,"outcome":"accepted","settle_confirmed":true}}\n')
        if len(send_lines) >= BUFFER_LINES:
            written += len(send_lines) + len(delivery_lines)
            sends.writelines(send_lines)
            received.writelines(delivery_lines)
            send_lines, delivery_lines = [], []
    sends.writelines(send_lines)
    received.writelines(delivery_lines)
    sends.close()
    received.close()
    return written + len(send_lines) + len(delivery_lines)


def _events(deliveries: int) -> list[dict]:
    """At each shift every consumer detaches and attaches again, in the pause of the sends: a node restart
    after the old consumers' last settle (at most 46 ms after the last send) and before the first
    message after the pause."""
    events = []
    shift_every = _shift_every(deliveries)
    for shift in range(1, min((deliveries - 1) // shift_every, SHIFTS) + 1):
        at_ms = START_MS + (shift * shift_every) // SEND_RATE_PER_MS + (shift - 1) * RESTART_PAUSE_MS + 50
        for queue in range(2):
            for consumer in range(CONSUMERS_PER_QUEUE):
                common = {"consumer": f"q{queue}c{consumer}", "node": "amqp://127.0.0.1:5672", "queue": f"q{queue}"}
                events.append({"kind": "detach", **common, "at_ms": at_ms, "condition": "connection lost"})
                events.append({"kind": "attach", **common, "at_ms": at_ms + 20})
    return events


def planted_losses(deliveries: int) -> int:
    return deliveries // LOST_EVERY


def planted_changes(deliveries: int) -> int:
    """Every group moves at every shift (each segment holds every group: shift_every >= GROUPS)."""
    shift_every = _shift_every(deliveries)
    return GROUPS * min((deliveries - 1) // shift_every, SHIFTS) if shift_every >= GROUPS else -1


def generate(directory: Path, deliveries: int) -> dict:
    directory.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with multiprocessing.get_context("fork").Pool(WRITERS) as pool:
        lines = sum(pool.starmap(_write_share, [(str(directory), writer, deliveries) for writer in range(WRITERS)]))
    events = _events(deliveries)
    (directory / "events.jsonl").write_text("".join(json.dumps(event) + "\n" for event in events))
    size_bytes = sum(path.stat().st_size for path in directory.glob("*.jsonl"))
    return {"lines": lines + len(events), "bytes": size_bytes, "generate_s": round(time.monotonic() - started, 1)}
