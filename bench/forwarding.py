"""Messages/s of node-to-node forwarding over loopback, one Forward call in flight, by batch size.

`python -m bench.forwarding` starts an owner process (this script with `--serve`: a gRPC server
carrying node.peer.service whose handler just returns the batch's last forward_seq), then, in this
process, pushes the same messages through a `node.peer.forwarder.Forwarder` once per batch size
and prints a markdown table. Everything the node pays per message is inside the timing: Entry ->
protobuf on the sender, protobuf -> Entry and the batch checks at the owner, one call in flight.
Batch size 1 is unary Forward with one message per call, one at a time. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc

from node.peer.forwarder import Entry, Forwarder
from node.peer.service import SERVER_OPTIONS, add_peer_service

REPO_ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
SERVER_WORKERS = 4
RUN_TIMEOUT_S = 300  # one row that takes longer than this is reported as failed


def serve() -> int:
    """Owner process: print the port, serve until stdin closes."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=SERVER_WORKERS),
                         options=[*SERVER_OPTIONS, ("grpc.so_reuseport", 0)])
    add_peer_service(server, lambda source_node, entries, timeout_ms, *bounds: entries[-1].forward_seq)
    port = server.add_insecure_port(f"{HOST}:0")
    server.start()
    print(port, flush=True)
    sys.stdin.read()
    server.stop(None)
    return 0


def measure(address: str, batch_messages_max: int, messages: int, payload_bytes: int) -> float:
    """Messages/s from the first submit to the ack of the last message."""
    payload = b"x" * payload_bytes
    batch = [Entry(forward_seq=seq, queue="bench", group_id=f"g{seq % 100}", payload=payload,
                   expires_at_ms=0, closes_group=False, enqueued_at_ms=seq) for seq in range(1, messages + 1)]
    done = threading.Event()

    def on_acked(high_water: int) -> None:
        if high_water >= messages:
            done.set()

    forwarder = Forwarder("bench-source", "bench-owner", lambda: address, on_acked,
                          batch_messages_max=batch_messages_max)
    try:
        # warm the channel up so connection set-up is not charged to the row
        forwarder.submit(batch[:1])
        while forwarder.pending_count:
            time.sleep(0.01)
        started = time.perf_counter()
        forwarder.submit(batch[1:])
        if not done.wait(RUN_TIMEOUT_S):
            raise RuntimeError(f"batch size {batch_messages_max}: not all acked within {RUN_TIMEOUT_S} s")
        elapsed_s = time.perf_counter() - started
    finally:
        forwarder.close()
    return (messages - 1) / elapsed_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000, help="messages per row (default 20000)")
    parser.add_argument("--payload-bytes", type=int, default=100)
    parser.add_argument("--batches", default="1,100,500", help="batch sizes (messages per Forward call)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve()

    owner = subprocess.Popen([sys.executable, "-m", "bench.forwarding", "--serve"], cwd=REPO_ROOT,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        address = f"{HOST}:{int(owner.stdout.readline())}"
        rows = []
        for batch_messages_max in (int(size) for size in args.batches.split(",")):
            rate = measure(address, batch_messages_max, args.messages, args.payload_bytes)
            rows.append((batch_messages_max, rate))
    finally:
        owner.stdin.close()
        owner.wait(10)

    print(f"{args.messages} messages of {args.payload_bytes} bytes, one Forward call in flight, "
          f"owner in a second process on {HOST}\n")
    print("| messages per Forward call | messages/s | calls/s |")
    print("| ---: | ---: | ---: |")
    for batch_messages_max, rate in rows:
        print(f"| {batch_messages_max} | {rate:,.0f} | {rate / batch_messages_max:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
