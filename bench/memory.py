"""What queued messages and groups cost in the dispatch core's memory, in-process, and its dispatch time.

    python -m bench.memory [--messages N] [--only SCENARIO ...] [--no-rss]

Each scenario runs in a child process of its own against node/core's Broker and Queue (no node, no
AMQP), so one scenario's freed memory never hides the next one's growth. Two figures per scenario:
- tracemalloc: the bytes of Python objects the core allocated and still holds, counted exactly and
  deterministically (the same on every run). This is what a structure costs: the per-message and
  per-group targets of issue 14 are read from it.
- RSS: the growth of the resident set in a second child without tracemalloc (tracemalloc's own
  bookkeeping would be counted otherwise). It adds what the OS sees beyond the objects: pymalloc
  arenas, free lists and fragmentation. It is noisier, but a node's memory limit counts it.

What is counted and what each scenario (--only NAME) sends and reports: docs/benchmarks-method.md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

from node.core.dispatch.broker import Broker
from node.core.effects import Deliver, Stored
from node.core.dispatch.message import Message, Outcome
from node.core.cluster.outbound import Entry, Outbound
from node.core.dispatch.settings import QueueSettings

REPO_ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = bytes(150)  # shared by every message: the body is not what is measured
GROUPS_FOR_PER_MESSAGE = 1_000
CONSUMERS_SPREAD = 100
DISPATCH_CONSUMERS = 4
DISPATCH_CREDIT = 100
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
SCENARIOS = ("per_message", "per_group", "idle_after_drain", "owned_empty_spread", "owned_empty_one", "paged",
             "cold", "cold_own_groups", "outbound_paged", "outbound_timing", "dispatch")
PAGED_BODY_BYTES = 100  # issue 14's body size
PAGED_BUDGET_BYTES = 1 << 20
JOURNALLED_BATCH_MESSAGES = 10_000  # STOREs reported durable at once
COLD_RECORD_BUDGET_BYTES = 1 << 20  # record_memory_max_bytes of the cold scenarios (node/core/dispatch/cold.py)


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE_BYTES


def unlimited_queue(broker: Broker, policy: str = "exclusive"):
    return broker.declare_queue(QueueSettings(name="q", durable=False, group_policy=policy, depth_max_messages=0,
                                              depth_max_bytes=0, groups_max=0))


def group_name(index: int) -> str:
    return f"group-{index:07d}"  # made per message, as the decoder does; 13 characters like a short id


def fill(broker: Broker, messages: int, groups: int) -> None:
    for seq in range(messages):
        broker.enqueue("q", Message(PAYLOAD, group_name(seq % groups)), 0)


def drain(broker: Broker, consumer_ids: list, credit: int) -> int:
    """Give each consumer `credit` and accept whatever it is delivered; returns the deliveries."""
    delivered = 0
    for consumer_id in consumer_ids:
        for effect in broker.set_credit(consumer_id, credit, 0):
            if type(effect) is Deliver:
                broker.settle(effect.consumer_id, effect.delivery_id, Outcome.ACCEPTED, 0)
                delivered += 1
    return delivered


def scenario(name: str, messages: int, broker: Broker, measure) -> dict:
    """Set up what is not measured, then let `measure(start, stop)` bracket the part that is."""
    if name == "paged":
        return paged(messages, broker, measure)
    if name.startswith("cold"):
        return cold(messages, messages if name == "cold_own_groups" else GROUPS_FOR_PER_MESSAGE, broker, measure)
    consumers: list = []
    if name.startswith("owned_empty"):
        count = CONSUMERS_SPREAD if name == "owned_empty_spread" else 1
        consumers = [f"c{index}" for index in range(count)]
    elif name == "idle_after_drain":
        consumers = ["c0"]
    unlimited_queue(broker, "shared" if name == "idle_after_drain" else "exclusive")
    for consumer_id in consumers:
        broker.attach_consumer("q", consumer_id, False, 0)
    with measure:
        if name == "per_message":
            fill(broker, messages, GROUPS_FOR_PER_MESSAGE)
        else:
            fill(broker, messages, messages)
            if consumers:
                # every consumer takes one group per pass until all are delivered (fewest groups first)
                delivered = 0
                while delivered < messages:
                    delivered += drain(broker, consumers, 1)
    queue = broker.queues["q"]
    return {"groups": len(queue.groups), "depth": queue.depth_messages}


def paged(messages: int, broker: Broker, measure) -> dict:
    broker.declare_queue(QueueSettings(name="q", depth_max_messages=0, depth_max_bytes=0, groups_max=0,
                                       memory_max_bytes=PAGED_BUDGET_BYTES))
    with measure:
        send_journalled(broker, messages, GROUPS_FOR_PER_MESSAGE)
    queue = broker.queues["q"]
    assert queue.pager.paged_bytes >= (messages * PAGED_BODY_BYTES) - PAGED_BUDGET_BYTES
    return {"groups": len(queue.groups), "depth": queue.depth_messages}


def cold(messages: int, groups: int, broker: Broker, measure) -> dict:
    """Past a small record budget: the newest messages wait in the journal, only counted here."""
    broker.records.max_bytes = COLD_RECORD_BUDGET_BYTES
    broker.declare_queue(QueueSettings(name="q", depth_max_messages=0, depth_max_bytes=0, groups_max=0,
                                       memory_max_bytes=PAGED_BUDGET_BYTES))
    with measure:
        send_journalled(broker, messages, groups)
    queue = broker.queues["q"]
    assert queue.cold.count >= messages - COLD_RECORD_BUDGET_BYTES // 160 and not queue.cold.pending
    return {"groups": len(queue.groups), "depth": queue.depth_messages}


OUTBOUND_OWNER = "n2"
OUTBOUND_ACKNOWLEDGE_STEP_ENTRIES = 1_000


def outbound_fill(outbound: Outbound, messages: int, groups: int) -> None:
    """Add `messages` 100-byte entries for one owner and make them ready a journalled batch at a time, as
    the cluster protocol does once a batch is on disk; the forwarder's effects are dropped (not counted)."""
    name = outbound.journal_name(OUTBOUND_OWNER, "q")
    batch: list = []
    for seq in range(1, messages + 1):
        group = group_name(seq % groups)
        outbound.add(OUTBOUND_OWNER, seq, ("q", group), name, PAGED_BODY_BYTES)
        batch.append(Entry(seq, "q", group, PAYLOAD, 0, False, 0))
        if len(batch) >= JOURNALLED_BATCH_MESSAGES:
            outbound.ready(OUTBOUND_OWNER, batch, [])
            batch = []
    outbound.ready(OUTBOUND_OWNER, batch, [])


def outbound_paged(messages: int, measure) -> dict:
    outbound = Outbound(memory_max_bytes=PAGED_BUDGET_BYTES)
    with measure:
        outbound_fill(outbound, messages, GROUPS_FOR_PER_MESSAGE)
    assert outbound.paged_messages[OUTBOUND_OWNER] >= messages - PAGED_BUDGET_BYTES // PAGED_BODY_BYTES
    return {"groups": len(outbound.key_counts[OUTBOUND_OWNER]), "depth": len(outbound.channels[OUTBOUND_OWNER])}


def outbound_timing(messages: int) -> dict:
    outbound = Outbound(memory_max_bytes=PAGED_BUDGET_BYTES)
    started = time.process_time()
    outbound_fill(outbound, messages, GROUPS_FOR_PER_MESSAGE)
    filled = time.process_time()
    for high_water in range(OUTBOUND_ACKNOWLEDGE_STEP_ENTRIES, messages + OUTBOUND_ACKNOWLEDGE_STEP_ENTRIES,
                            OUTBOUND_ACKNOWLEDGE_STEP_ENTRIES):
        outbound.acknowledge(OUTBOUND_OWNER, high_water)
    acknowledged = time.process_time()
    assert not outbound.channels[OUTBOUND_OWNER] and not outbound.paged_messages
    return {"add_us_per_entry": (filled - started) * 1e6 / messages,
            "acknowledge_us_per_entry": (acknowledged - filled) * 1e6 / messages}


def send_journalled(broker: Broker, messages: int, groups: int) -> None:
    """Send `messages` 100-byte bodies of their own, reporting their STOREs on disk in batches as the journal would."""
    stores = []
    for seq in range(messages):
        body = seq.to_bytes(8, "little") * (PAGED_BODY_BYTES // 8) + bytes(PAGED_BODY_BYTES % 8)
        for effect in broker.enqueue("q", Message(body, group_name(seq % groups)), 0):
            if type(effect) is Stored:
                stores.append((effect.queue, effect.message))
        if len(stores) >= JOURNALLED_BATCH_MESSAGES:
            broker.journalled(stores, 0)
            stores = []
    broker.journalled(stores, 0)


class Bracket:
    def __init__(self, use_tracemalloc: bool):
        self.use_tracemalloc = use_tracemalloc
        self.bytes = 0

    def __enter__(self):
        if self.use_tracemalloc:
            tracemalloc.start()
            self.start = tracemalloc.get_traced_memory()[0]
        else:
            self.start = rss_bytes()
        return self

    def __exit__(self, *exc):
        if self.use_tracemalloc:
            self.bytes = tracemalloc.get_traced_memory()[0] - self.start
            tracemalloc.stop()
        else:
            self.bytes = rss_bytes() - self.start
        return False


def dispatch_timing(messages: int) -> dict:
    broker = Broker()
    unlimited_queue(broker)
    consumers = [f"c{index}" for index in range(DISPATCH_CONSUMERS)]
    for consumer_id in consumers:
        broker.attach_consumer("q", consumer_id, False, 0)
    names = [group_name(index) for index in range(GROUPS_FOR_PER_MESSAGE)]
    started = time.process_time()
    for consumer_id in consumers:
        broker.set_credit(consumer_id, DISPATCH_CREDIT, 0)
    credit = dict.fromkeys(consumers, DISPATCH_CREDIT)
    for seq in range(messages):
        for effect in broker.enqueue("q", Message(PAYLOAD, names[seq % GROUPS_FOR_PER_MESSAGE]), 0):
            if type(effect) is Deliver:
                broker.settle(effect.consumer_id, effect.delivery_id, Outcome.ACCEPTED, 0)
                credit[effect.consumer_id] -= 1
                if credit[effect.consumer_id] == 0:  # topped up in bulk, as a prefetch window is
                    credit[effect.consumer_id] = DISPATCH_CREDIT
                    broker.set_credit(effect.consumer_id, DISPATCH_CREDIT, 0)
    elapsed_s = time.process_time() - started
    return {"us_per_message": elapsed_s * 1e6 / messages, "delivered": broker.queues["q"].delivered_total}


def child(name: str, messages: int, use_tracemalloc: bool) -> dict:
    if name == "dispatch":
        return dispatch_timing(messages)
    if name == "outbound_timing":
        return outbound_timing(messages)
    bracket = Bracket(use_tracemalloc)
    if name == "outbound_paged":
        shape = outbound_paged(messages, bracket)
        return {"bytes": bracket.bytes, **shape}
    shape = scenario(name, messages, Broker(), bracket)
    return {"bytes": bracket.bytes, **shape}


def run_child(name: str, messages: int, use_tracemalloc: bool) -> dict:
    command = [sys.executable, "-m", "bench.memory", "--child", name, "--messages", str(messages)]
    if use_tracemalloc:
        command.append("--tracemalloc")
    output = subprocess.run(command, cwd=REPO_ROOT, check=True, capture_output=True, text=True).stdout
    return json.loads(output)


def per(value: float, count: int) -> str:
    return f"{value / count:,.1f}" if count else "-"


def table(messages: int, names: list[str], with_rss: bool) -> str:
    rows = ["| scenario | what is divided | tracemalloc B/unit | RSS B/unit | groups left | messages left |",
            "| --- | --- | ---: | ---: | ---: | ---: |"]
    for name in names:
        if name == "dispatch":
            timing = run_child(name, messages, False)
            rows.append(f"| dispatch | CPU µs per message (enqueue + deliver + accept) | "
                        f"{timing['us_per_message']:.2f} µs | - | - | - |")
            continue
        if name == "outbound_timing":
            timing = run_child(name, messages, False)
            rows.append(f"| outbound_timing | CPU µs per outbound entry (add + ready / acknowledge) | "
                        f"{timing['add_us_per_entry']:.2f} / {timing['acknowledge_us_per_entry']:.2f} µs | - | - | - |")
            continue
        traced = run_child(name, messages, True)
        resident = run_child(name, messages, False) if with_rss else None
        units = {"per_message": "queued messages", "paged": "queued messages", "cold": "queued messages",
                 "outbound_paged": "outbound entries"}.get(name, "groups")
        rows.append(f"| {name} | {messages:,} {units} | {per(traced['bytes'], messages)} | "
                    f"{per(resident['bytes'], messages) if resident else '-'} | {traced['groups']:,} | "
                    f"{traced['depth']:,} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000, help="messages (and groups) per scenario")
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, help="run only these scenarios")
    parser.add_argument("--no-rss", action="store_true", help="skip the RSS children (tracemalloc only)")
    parser.add_argument("--child", choices=SCENARIOS, help=argparse.SUPPRESS)
    parser.add_argument("--tracemalloc", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.messages < 1:
        parser.error(f"--messages must be at least 1, got {args.messages}")
    if args.child:
        print(json.dumps(child(args.child, args.messages, args.tracemalloc)))
        return 0
    names = args.only or list(SCENARIOS)
    print(f"python3 -m bench.memory --messages {args.messages:,}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, Python {sys.version.split()[0]}\n")
    print(table(args.messages, names, not args.no_rss))
    return 0


if __name__ == "__main__":
    sys.exit(main())
