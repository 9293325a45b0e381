"""A randomised load run over one grouped queue, in the manner of Qpid's msg_group_test.

Several producers (threads, one connection each) send interleaved groups of random sizes; several
consumers (threads, one connection each) take them with random credit windows, settle every k-th
message in a batch and now and then hand a whole batch back as failed. Afterwards the recorded
history must show, for the policy under test:

- completeness: every message accepted exactly once; a message seen again carries delivery_count > 0;
- order: within a group, first deliveries and acceptances both follow the producer's sequence;
- shared: no two consumers ever hold unsettled messages of one group at the same time;
- exclusive: all of a group's deliveries go to one consumer.

Every event is stamped from one counter shared by all threads. A receipt is stamped after the
message reached the client and a settlement before it is sent, so an event the node ordered
before another is stamped before it: the checks never blame the node for a client-side delay.
The plan (group sizes, interleaving, credit, batch sizes) comes from a seeded random.Random; thread
scheduling does not, so the seed is printed with any failure.
"""

from __future__ import annotations

import itertools
import json
import random
import threading
import time
from dataclasses import dataclass, field

import pytest
from proton import Delivery, Message, Timeout

from tests.integration.harness import ManualReceiver, connect

QUEUE = "stress"
MESSAGES_TOTAL = 3000
SENDERS = 3
RECEIVERS = 4
GROUP_SIZE_MAX = 110  # group sizes are drawn from 1..this; ~3000 / 55 gives about 50 groups
INTERLEAVE_MAX = 5  # groups a producer has open at once
CREDIT_MAX = 50
ACK_EVERY_MAX = 10
FAILED_BATCH_PROBABILITY = 0.05  # consumers that misfire hand back a whole batch this often
SEND_WINDOW = 200  # unsettled messages a producer keeps in flight
IDLE_FLUSH_S = 0.05  # a consumer settles what it holds when nothing arrived for this long
RUN_DEADLINE_S = 25.0
SEEDS = {"shared": 20240611, "exclusive": 20240612}

STAMP = itertools.count()  # the common clock of every thread; next() is atomic under the GIL


# ---- the plan --------------------------------------------------------------------------------

def plan_streams(rng: random.Random) -> list[list[tuple[str, int]]]:
    """One list of (group, sequence) per producer: random group sizes, random interleaving."""
    per_sender = [MESSAGES_TOTAL // SENDERS + (1 if i < MESSAGES_TOTAL % SENDERS else 0) for i in range(SENDERS)]
    streams = []
    for sender_index, budget in enumerate(per_sender):
        interleave = rng.randint(1, INTERLEAVE_MAX)
        open_groups: list[list] = []  # [name, next seq, size]
        names = (f"s{sender_index}-g{n}" for n in itertools.count())
        stream: list[tuple[str, int]] = []
        planned = 0  # messages promised to open groups
        while len(stream) < budget:
            while len(open_groups) < interleave and planned < budget:
                size = min(rng.randint(1, GROUP_SIZE_MAX), budget - planned)
                open_groups.append([next(names), 0, size])
                planned += size
            group = rng.choice(open_groups)
            stream.append((group[0], group[1]))
            group[1] += 1
            if group[1] == group[2]:
                open_groups.remove(group)
        streams.append(stream)
    return streams


@dataclass
class ConsumerPlan:
    name: str
    credit: int
    ack_every: int
    failed_batch_probability: float
    seed: int


def plan_consumers(rng: random.Random) -> list[ConsumerPlan]:
    return [ConsumerPlan(f"c{i}", rng.randint(1, CREDIT_MAX), rng.randint(1, ACK_EVERY_MAX),
                         FAILED_BATCH_PROBABILITY if i % 2 else 0.0, rng.randrange(1 << 30))
            for i in range(RECEIVERS)]


# ---- the run ---------------------------------------------------------------------------------

@dataclass
class Event:
    stamp: int
    consumer: str
    kind: str  # "receive", "accept", "fail"
    group: str
    seq: int
    delivery_count: int = 0


@dataclass
class Run:
    expected_total: int
    events: list[Event] = field(default_factory=list)
    accepted_total: int = 0
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    done: threading.Event = field(default_factory=threading.Event)

    def record(self, consumer: str, kind: str, group: str, seq: int, delivery_count: int = 0) -> None:
        self.events.append(Event(next(STAMP), consumer, kind, group, seq, delivery_count))

    def count_accepted(self, count: int) -> None:
        with self.lock:
            self.accepted_total += count
            if self.accepted_total >= self.expected_total:
                self.done.set()


def produce(node, stream: list[tuple[str, int]], name: str, run: Run) -> None:
    connection = connect(node)
    try:
        link = connection.create_sender(QUEUE, name=name).link
        unsettled = []
        refused = []

        def collect():
            for delivery in [d for d in unsettled if d.settled]:
                if delivery.remote_state != Delivery.ACCEPTED:
                    refused.append(delivery.remote_state)
                delivery.settle()
                unsettled.remove(delivery)

        for group, seq in stream:
            if not link.credit or len(unsettled) >= SEND_WINDOW:
                connection.wait(lambda: link.credit > 0 and sum(1 for d in unsettled if not d.settled) < SEND_WINDOW,
                                timeout=RUN_DEADLINE_S, msg=f"credit for {name}")
                collect()
            message = Message(body=f"{group}:{seq}", properties={"group_seq": seq})
            message.group_id = group
            unsettled.append(link.send(message))
        connection.wait(lambda: all(d.settled for d in unsettled), timeout=RUN_DEADLINE_S,
                        msg=f"outcomes for {name}")
        collect()
        if refused:
            run.errors.append(f"{name}: {len(refused)} messages refused, e.g. state {refused[0]}")
    except Exception as error:  # reported by the test thread
        run.errors.append(f"{name}: {type(error).__name__}: {error}")
    finally:
        connection.close()


def consume(node, plan: ConsumerPlan, run: Run) -> None:
    rng = random.Random(plan.seed)
    connection = connect(node)
    try:
        receiver = ManualReceiver(connection, QUEUE, plan.name, credit=plan.credit)
        held: list = []

        def settle_held():
            failed = rng.random() < plan.failed_batch_probability
            for item in held:
                message, delivery = item.message, item.delivery
                run.record(plan.name, "fail" if failed else "accept", message.group_id,
                           message.properties["group_seq"])
                if failed:
                    delivery.local.failed = True
                    delivery.update(Delivery.MODIFIED)
                else:
                    delivery.update(Delivery.ACCEPTED)
                delivery.settle()
            if not failed:
                run.count_accepted(len(held))
            held.clear()

        while not run.done.is_set() and not run.errors:
            try:
                connection.wait(lambda: receiver.arrived_count or run.done.is_set(), timeout=IDLE_FLUSH_S)
            except Timeout:
                if held:
                    settle_held()
                continue
            taken = receiver.take_arrived()
            for item in taken:
                message = item.message
                run.record(plan.name, "receive", message.group_id, message.properties["group_seq"],
                           message.delivery_count)
                held.append(item)
                if len(held) >= plan.ack_every:
                    settle_held()
            if taken:
                receiver.flow(len(taken))  # credit stays at the window, whatever is still unsettled
        if held:
            settle_held()
    except Exception as error:
        run.errors.append(f"{plan.name}: {type(error).__name__}: {error}")
        run.done.set()
    finally:
        try:
            connection.close()
        except Exception:
            pass


def run_load(node, seed: int) -> tuple[Run, list, list]:
    rng = random.Random(seed)
    streams = plan_streams(rng)
    plans = plan_consumers(rng)
    run = Run(expected_total=sum(len(s) for s in streams))
    threads = [threading.Thread(target=consume, args=(node, plan, run), name=plan.name) for plan in plans]
    threads += [threading.Thread(target=produce, args=(node, stream, f"p{i}", run), name=f"p{i}")
                for i, stream in enumerate(streams)]
    for thread in threads:
        thread.start()
    finished = run.done.wait(RUN_DEADLINE_S)
    if not finished:
        run.errors.append(f"only {run.accepted_total} of {run.expected_total} messages accepted "
                          f"within {RUN_DEADLINE_S} s")
        run.done.set()
    for thread in threads:
        thread.join(RUN_DEADLINE_S)
        if thread.is_alive():
            run.errors.append(f"thread {thread.name} did not finish")
    return run, streams, plans


# ---- the checks ------------------------------------------------------------------------------

def check_completeness(run: Run, streams) -> list[str]:
    problems = []
    sent = {(group, seq) for stream in streams for group, seq in stream}
    accepted: dict[tuple, int] = {}
    receipts: dict[tuple, list[Event]] = {}
    for event in run.events:
        key = (event.group, event.seq)
        if event.kind == "accept":
            accepted[key] = accepted.get(key, 0) + 1
        elif event.kind == "receive":
            receipts.setdefault(key, []).append(event)
    missing = sent - set(accepted)
    if missing:
        problems.append(f"{len(missing)} messages never accepted, e.g. {sorted(missing)[:5]}")
    twice = sorted(key for key, count in accepted.items() if count > 1)
    if twice:
        problems.append(f"{len(twice)} messages accepted more than once, e.g. {twice[:5]}")
    strangers = set(receipts) - sent
    if strangers:
        problems.append(f"received messages nobody sent: {sorted(strangers)[:5]}")
    for key, seen in receipts.items():
        if seen[0].delivery_count != 0:
            problems.append(f"{key} first delivered with delivery_count {seen[0].delivery_count}")
        unflagged = [e for e in seen[1:] if e.delivery_count == 0]
        if unflagged:
            problems.append(f"{key} delivered again to {unflagged[0].consumer} with delivery_count 0")
    return problems


def check_group_order(run: Run) -> list[str]:
    """First deliveries follow the group's sequence; so do acceptances, in groups never handed back.

    A consumer that hands a batch back may already have the group's next message on the wire: it
    then gets that one first and the returned ones after it, so acceptance order is only promised
    for groups whose consumers settled everything as accepted."""
    problems = []
    first_deliveries: dict[str, list[int]] = {}
    acceptances: dict[str, list[int]] = {}
    handed_back = {event.group for event in run.events if event.kind == "fail"}
    for event in run.events:
        if event.kind == "receive" and event.delivery_count == 0:
            first_deliveries.setdefault(event.group, []).append(event.seq)
        elif event.kind == "accept":
            acceptances.setdefault(event.group, []).append(event.seq)
    for group, seqs in sorted(first_deliveries.items()):
        if seqs != sorted(seqs):
            problems.append(f"group {group}: first deliveries out of order: {seqs[:20]}")
    for group, seqs in sorted(acceptances.items()):
        if group not in handed_back and seqs != list(range(len(seqs))):
            problems.append(f"group {group}: accepted out of order: {seqs[:20]}")
    return problems


def check_one_holder_at_a_time(run: Run) -> list[str]:
    problems = []
    holder: dict[str, str] = {}
    held: dict[str, int] = {}
    for event in run.events:
        group = event.group
        if event.kind == "receive":
            if held.get(group) and holder[group] != event.consumer:
                problems.append(f"group {group}: {event.consumer} got {group}:{event.seq} while "
                                f"{holder[group]} still held {held[group]} unsettled")
            holder[group] = event.consumer
            held[group] = held.get(group, 0) + 1
        else:
            held[group] -= 1
    return problems


def check_one_consumer_per_group(run: Run) -> list[str]:
    consumers: dict[str, set] = {}
    for event in run.events:
        if event.kind == "receive":
            consumers.setdefault(event.group, set()).add(event.consumer)
    return [f"group {group} went to {sorted(names)}" for group, names in sorted(consumers.items()) if len(names) > 1]


# ---- the tests -------------------------------------------------------------------------------

@pytest.mark.parametrize("policy", ["shared", "exclusive"])
def test_random_load_keeps_groups_ordered_complete_and_single_holder(node_factory, policy):
    node = node_factory(f'[node]\nauto_create = false\n\n[[queue]]\nname = "{QUEUE}"\n'
                        f'group_policy = "{policy}"\n')
    seed = SEEDS[policy]
    started = time.monotonic()
    run, streams, plans = run_load(node, seed)
    elapsed_s = time.monotonic() - started

    run.events.sort(key=lambda e: e.stamp)
    problems = list(run.errors)
    problems += check_completeness(run, streams)
    problems += check_group_order(run)
    if policy == "shared":
        problems += check_one_holder_at_a_time(run)
    else:
        problems += check_one_consumer_per_group(run)
    groups = len({group for stream in streams for group, _ in stream})
    failed_batches = sum(1 for e in run.events if e.kind == "fail")
    summary = (f"seed {seed}, {policy}, {run.expected_total} messages in {groups} groups, {elapsed_s:.1f} s, "
               f"{failed_batches} deliveries handed back; consumers "
               + ", ".join(f"{p.name}(credit {p.credit}, ack every {p.ack_every})" for p in plans))
    assert not problems, summary + "\n" + "\n".join(problems[:30])

    rows = json.loads(node.cli("groups", QUEUE, "--json").stdout or "[]")
    assert all(row["messages"] == 0 and row["acquired"] == 0 for row in rows), rows
    listed = {q["name"]: q for q in json.loads(node.cli("queue", "list", "--json").stdout)}
    assert listed[QUEUE]["depth_messages"] == 0 and listed[QUEUE]["acquired_messages"] == 0, listed[QUEUE]
    print(summary)
