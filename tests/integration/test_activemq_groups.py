"""Message groups as ActiveMQ Classic users expect them, against a real node on 127.0.0.1.

Scenarios from the Classic "Message Groups" page (seed 003): closing groups so they can be handed
out again, the first-for-consumer flag when ownership changes, late joiners held back by delayed
dispatch (a consumer count, a time, or both), and per-group order while consumers come and go
under a steady producer.
"""

from __future__ import annotations

import random
import threading
import time

from tests.integration.clients import FIRST_KEY, Client, by_group, group_message, owners, queue_toml

QUEUE = "trades"


def config(**settings) -> str:
    return queue_toml(QUEUE, durable=False, **settings)


def test_closed_groups_are_handed_out_again_across_consumers(node_factory):
    node = node_factory(config())
    groups = ["IBM", "MSFT", "SUNW", "ORCL"]
    with Client(node) as client:
        busy = client.consumer(QUEUE, "busy", credit=8)
        idle = client.consumer(QUEUE, "idle", credit=0)
        producer = client.producer(QUEUE)
        producer.send(*[group_message(g, 1) for g in groups])
        opened = busy.take(4)
        idle.flow(100)
        producer.send(*[group_message(g, 2, jms=True, close="jms") for g in groups])
        closing = busy.take(4)
        assert idle.take_all() == [], "a closing message went past its group's owner"
        busy.accept(*opened, *closing)

        busy.flow(100)
        producer.send(*[group_message(g, seq) for seq in (3, 4) for g in groups])
        reopened = client.collect([busy, idle], 8)

        assert {r.consumer.name for r in reopened} == {"busy", "idle"}, \
            f"closed groups should be spread again, got {owners(reopened)}"
        for group, items in by_group(reopened).items():
            assert len({r.consumer.name for r in items}) == 1, f"group {group} split: {items}"
            assert [r.seq for r in items] == [3, 4]


def test_first_for_consumer_is_set_once_per_group_and_again_when_the_group_changes_hands(node_factory):
    node = node_factory(config(group_first_key=FIRST_KEY))
    groups = [f"g{i}" for i in range(6)]
    with Client(node) as client:
        left = client.consumer(QUEUE, "left", credit=100)
        right = client.consumer(QUEUE, "right", credit=100)
        producer = client.producer(QUEUE)
        producer.send(*[group_message(g, seq, jms=True) for seq in (1, 2, 3) for g in groups])
        received = client.collect([left, right], 18)

        flagged = sorted((r.group, r.seq) for r in received if r.first_for_consumer)
        assert flagged == [(g, 1) for g in groups], "exactly each group's first message should be flagged"
        owner_before = {g: names.pop() for g, names in owners(received).items()}
        assert set(owner_before.values()) == {"left", "right"}
        for consumer in (left, right):
            consumer.accept(*[r for r in received if r.consumer is consumer])

        left.close()
        producer.send(*[group_message(g, 4, jms=True) for g in groups])
        after = right.take(6)
        for item in after:
            moved = owner_before[item.group] == "left"
            assert item.first_for_consumer is moved, \
                f"{item}: flag should be {moved} (group {'moved from left' if moved else 'stayed on right'})"


def test_consumers_before_dispatch_keeps_a_backlog_from_the_first_consumer(node_factory):
    node = node_factory(config(consumers_before_dispatch=3))
    groups = [f"g{i}" for i in range(6)]
    with Client(node) as client:
        client.producer(QUEUE).send(*[group_message(g, seq) for seq in range(1, 6) for g in groups])

        first = client.consumer(QUEUE, "first", credit=100)
        assert first.take_all() == [], "dispatch started with one consumer of three"
        second = client.consumer(QUEUE, "second", credit=100)
        assert first.take_all() + second.take_all() == [], "dispatch started with two consumers of three"
        third = client.consumer(QUEUE, "third", credit=100)
        received = client.collect([first, second, third], 30)

        per_consumer = {name: sorted(g for g, names in owners(received).items() if name in names)
                        for name in ("first", "second", "third")}
        assert all(per_consumer.values()), f"every consumer should get some groups: {per_consumer}"
        for group, items in by_group(received).items():
            assert len({r.consumer.name for r in items}) == 1, f"group {group} split: {items}"
            assert [r.seq for r in items] == [1, 2, 3, 4, 5]


def test_time_before_dispatch_starts_dispatch_with_one_consumer_once_the_time_passes(node_factory):
    node = node_factory(config(consumers_before_dispatch=3, time_before_dispatch_ms=500))
    with Client(node) as client:
        client.producer(QUEUE).send(*[group_message(f"g{i}", 1) for i in range(4)])
        attached_at = time.monotonic()
        only = client.consumer(QUEUE, "only", credit=100)
        received = only.take(4, timeout_s=5.0)
        waited_s = time.monotonic() - attached_at
        assert waited_s >= 0.45, f"dispatch started after {waited_s:.2f} s, before the 0.5 s delay"
        assert sorted(r.group for r in received) == ["g0", "g1", "g2", "g3"]


def test_time_before_dispatch_lets_consumers_attaching_within_the_delay_share_the_backlog(node_factory):
    node = node_factory(config(time_before_dispatch_ms=800))
    groups = [f"g{i}" for i in range(6)]
    with Client(node) as client:
        client.producer(QUEUE).send(*[group_message(g, seq) for seq in (1, 2) for g in groups])
        early = client.consumer(QUEUE, "early", credit=100)
        client.settle_down(0.1)
        late = client.consumer(QUEUE, "late", credit=100)
        received = client.collect([early, late], 12, timeout_s=5.0)
        assert {r.consumer.name for r in received} == {"early", "late"}, owners(received)


def test_dispatch_delay_applies_again_after_every_consumer_left(node_factory):
    node = node_factory(config(time_before_dispatch_ms=500))
    with Client(node) as client:
        producer = client.producer(QUEUE)
        first = client.consumer(QUEUE, "first", credit=100)
        client.settle_down(0.6)
        producer.send(group_message("g", 1))
        first.accept(*first.take(1))
        first.close()

        producer.send(group_message("g", 2))
        attached_at = time.monotonic()
        second = client.consumer(QUEUE, "second", credit=100)
        assert [r.seq for r in second.take(1, timeout_s=5.0)] == [2]
        waited_s = time.monotonic() - attached_at
        assert waited_s >= 0.45, f"no delay after every consumer had left: dispatch after {waited_s:.2f} s"


class SteadyProducer(threading.Thread):
    """Sends `count` messages round-robin over `groups` in batches, from its own connection."""

    def __init__(self, node, groups: list[str], count: int, batch: int = 10):
        super().__init__(daemon=True)
        self.node = node
        self.groups = groups
        self.count = count
        self.batch = batch
        self.sent: list[tuple[str, int]] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with Client(self.node) as client:
                producer = client.producer(QUEUE)
                next_seq = {g: 1 for g in self.groups}
                for start in range(0, self.count, self.batch):
                    messages = []
                    for index in range(start, min(start + self.batch, self.count)):
                        group = self.groups[index % len(self.groups)]
                        messages.append(group_message(group, next_seq[group]))
                        self.sent.append((group, next_seq[group]))
                        next_seq[group] += 1
                    producer.send(*messages)
                    time.sleep(0.005)  # a steady trickle, so consumers churn while it sends
        except BaseException as error:  # reported by the test thread
            self.error = error


def test_order_holds_and_nothing_is_lost_while_consumers_come_and_go(node_factory):
    node = node_factory(config())
    rng = random.Random(20240611)
    groups = [f"g{i}" for i in range(8)]
    producer = SteadyProducer(node, groups, count=400)
    first_delivery: dict[str, list[int]] = {g: [] for g in groups}
    seen: set[tuple[str, int]] = set()
    accepted: set[tuple[str, int]] = set()
    with Client(node) as client:
        open_consumers = []
        names = iter(f"c{i}" for i in range(10_000))
        producer.start()
        deadline = time.monotonic() + 25.0
        while time.monotonic() < deadline:
            if len(open_consumers) < 3 and (not open_consumers or rng.random() < 0.3):
                open_consumers.append(client.consumer(QUEUE, next(names), credit=rng.randint(1, 20)))
            client.settle_down(0.02)
            for consumer in list(open_consumers):
                fresh = list(consumer.unread)
                consumer.unread.clear()
                for item in fresh:
                    key = (item.group, item.seq)
                    holders = {c.name for c in open_consumers if c is not consumer and
                               any(r.group == item.group for r in c.history)}
                    assert not holders, f"{item}: group {item.group} is also held by open consumer(s) {holders}"
                    if key not in seen:
                        seen.add(key)
                        first_delivery[item.group].append(item.seq)
                to_accept = [r for r in fresh if rng.random() < 0.8]
                consumer.accept(*to_accept)
                accepted.update((r.group, r.seq) for r in to_accept)
                if fresh:
                    consumer.flow(len(fresh))  # keep the consumer's prefetch
                if rng.random() < 0.1:
                    consumer.close()  # leaves with whatever it did not accept
                    open_consumers.remove(consumer)
            if not producer.is_alive() and len(accepted) >= producer.count:
                break
        producer.join(10)
        assert producer.error is None, f"producer failed: {producer.error!r}"
        for consumer in open_consumers:
            consumer.close()
        drain = client.consumer(QUEUE, "drain", credit=500)
        rest = drain.take_all(1.0)
        for item in rest:
            if (item.group, item.seq) not in seen:
                seen.add((item.group, item.seq))
                first_delivery[item.group].append(item.seq)
        drain.accept(*rest)
        accepted.update((r.group, r.seq) for r in rest)

    for group, seqs in first_delivery.items():
        assert seqs == sorted(seqs), f"group {group}: first deliveries out of order: {seqs}"
    missing = sorted(set(producer.sent) - accepted)
    assert not missing, f"{len(missing)} messages were never delivered and accepted: {missing[:20]}"
    assert len(producer.sent) == 400
