"""Large messages past both memory budgets on one real `grouper node`: its peak resident set while it
drains them, and when it restarts on them.

    python3 -m bench.large_bodies [--messages 800] [--body-bytes 1048576] [--groups 50]

Why: the budgets count records and bodies, but three paths read or kept bodies by record counts, which
only large bodies show: browse-log tombstones kept every accepted body until their bytes passed the
queue's depth (paged and cold bytes included), a read of cold records brought 1,024 whole records back
at once, and a hand-over read a held group's paged bodies back whole. bench/paging.py's 100-byte bodies
never reach those bounds.

What and how: one node with `record_memory_max_bytes` = 256 KiB and `message_memory_max_bytes` = 8 MiB,
one durable queue; N durable messages of B bytes in G groups are sent (most go cold, the rest paged).
- drain: one consumer (credit 10, one more per accept) takes them all; the node's VmHWM (peak resident
  set) and VmRSS at the end are read from /proc.
- restart: the same backlog sent again, the node killed (-9) and started on its journal; VmHWM once it
  serves (it reads its cold tails' oldest back before), then drained as above.
The peak is the figure: a drain's resident set never needs more than the budgets, the read-ahead and a
few bodies in flight. One run prints one line per phase; the figures go into docs/benchmarks.md by hand
("Paging: node memory and paged drains", large bodies).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from proton import Message

from tests.integration.clients import Client, queue_toml
from tests.integration.harness import NodeProcess

QUEUE = "large"
RECORD_BUDGET_BYTES = 256 << 10
BODY_BUDGET_BYTES = 8 << 20
SEND_BATCH = 20  # messages sent before waiting for their outcomes
WAIT_S = 120.0  # for one batch's outcomes, or one delivery


def resident_mib(node: NodeProcess) -> tuple[int, int]:
    """(VmRSS, VmHWM) of the node process, MiB."""
    status = Path(f"/proc/{node.process.pid}/status").read_text().splitlines()
    kib = {line.split(":")[0]: int(line.split()[1]) for line in status if line.startswith(("VmRSS", "VmHWM"))}
    return kib["VmRSS"] >> 10, kib["VmHWM"] >> 10


def send(node: NodeProcess, messages: int, body_bytes: int, groups: int) -> None:
    padding = "x" * body_bytes
    with Client(node) as client:
        producer = client.producer(QUEUE)
        for start in range(0, messages, SEND_BATCH):
            batch = []
            for index in range(start, min(messages, start + SEND_BATCH)):
                message = Message(body=f"{padding}g{index % groups}:{index}", durable=True)
                message.group_id = f"g{index % groups}"
                batch.append(message)
            producer.send(*batch, timeout_s=WAIT_S)


def drain(node: NodeProcess, messages: int) -> None:
    with Client(node) as client:
        consumer = client.consumer(QUEUE, credit=10)
        for _ in range(messages):
            consumer.accept(*consumer.take(1, timeout_s=WAIT_S))
            consumer.flow(1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench.large_bodies", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=800)
    parser.add_argument("--body-bytes", type=int, default=1 << 20)
    parser.add_argument("--groups", type=int, default=50)
    args = parser.parse_args(argv)
    config = (f"[node]\nrecord_memory_max_bytes = {RECORD_BUDGET_BYTES}\n"
              f"message_memory_max_bytes = {BODY_BUDGET_BYTES}\n" + queue_toml(QUEUE))
    backlog_mib = args.messages * args.body_bytes >> 20
    print(f"{args.messages} messages of {args.body_bytes} bytes in {args.groups} groups ({backlog_mib} MiB); "
          f"record budget {RECORD_BUDGET_BYTES >> 10} KiB, body budget {BODY_BUDGET_BYTES >> 20} MiB")
    with tempfile.TemporaryDirectory(prefix="large-bodies-") as directory:
        node = NodeProcess(Path(directory) / "drain", config).start()
        try:
            send(node, args.messages, args.body_bytes, args.groups)
            print("drain: after the sends, resident %d MiB (peak %d)" % resident_mib(node), flush=True)
            drain(node, args.messages)
            print("drain: drained, resident %d MiB (peak %d)" % resident_mib(node), flush=True)
        finally:
            node.kill()
        node = NodeProcess(Path(directory) / "restart", config).start()
        try:
            send(node, args.messages, args.body_bytes, args.groups)
            node.kill()
            node.start()
            time.sleep(2)
            print("restart: serving, resident %d MiB (peak %d)" % resident_mib(node), flush=True)
            drain(node, args.messages)
            print("restart: drained, resident %d MiB (peak %d)" % resident_mib(node), flush=True)
        finally:
            node.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
