"""Group signals (issue 30, node/core/dispatch/group_signals.py): examples, and hypothesis against a reference
model that classifies every group by a pass over the whole table (what the core avoids doing)."""

from __future__ import annotations

import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from node.core.dispatch.broker import Broker
from node.core.dispatch.message import Message
from node.core.dispatch.queue_lanes import PAUSED
from node.core.dispatch.settings import QueueSettings


def signals(h) -> tuple:
    stats = h.stats()
    return stats["runnable_groups"], stats["blocked_groups"], stats["held_groups"]


def reference(queue) -> tuple:
    """(runnable, blocked, held, oldest head arrival) by looking at every group."""
    runnable = blocked = held = 0
    oldest = [m.enqueued_at_ms for m in queue._groups.ungrouped if m.state == 0][:1]
    for key, group in queue.groups.items():
        consumer = group.consumer
        held += consumer is not None
        head = next((m for m in group.messages() if m.state == 0), None)
        if head is None:
            continue
        oldest.append(head.enqueued_at_ms)
        waits = group.placed is PAUSED or key in queue.held_keys or head.available_at_ms > 0
        if consumer is None:
            runnable += not waits
            blocked += waits
        else:
            blocked += waits or not consumer.may_take
    return runnable, blocked, held, min((at for at in oldest if at), default=0)


def test_a_stuck_consumer_blocks_its_groups_and_new_groups_are_runnable(make):
    h = make(durable=False)
    h.attach("c1", 1)
    h.now_ms = 1000
    h.send("a", "a1")  # c1 takes a1 and stops: its credit is spent
    h.now_ms = 2000
    h.send("a", "a2")
    h.now_ms = 3000
    h.send("b", "b1")
    assert signals(h) == (1, 1, 1)  # b has no consumer and is ready; a waits on c1
    assert h.stats()["oldest_head_enqueued_at_ms"] == 2000  # a2 waits at a's head (a1 is in flight)
    h.credit("c1", 5)
    assert signals(h) == (0, 0, 2) and h.stats()["oldest_head_enqueued_at_ms"] == 0


def test_no_consumer_makes_every_group_with_messages_runnable(make):
    h = make(durable=False)
    for group in "abc":
        h.send(group, f"{group}1")
    h.send(None, "loose")
    assert signals(h) == (3, 0, 0)


def test_a_paused_group_and_a_cluster_held_group_are_blocked(make):
    h = make(durable=False)
    h.attach("c1", 10)
    h.send("a", "a1")
    h.send("b", "b1")
    h.accept("b1")
    h.reset("a")  # a1 is in flight: a pauses until it is settled
    h.credit("c1", 0)
    h.send("a", "a2")
    h.queue.hold_group("b")
    h.send("b", "b2")
    assert signals(h) == (0, 2, 2)
    h.accept("a1")
    assert signals(h) == (1, 1, 1)  # a is free now (and c1, without credit, did not take it)


def test_a_group_whose_head_waits_out_a_redelivery_delay_is_blocked(make):
    h = make(durable=False, redelivery_delay_ms=100)
    h.attach("c1", 10)
    h.send("a", "a1")
    h.modify("a1")
    assert signals(h) == (0, 1, 1)
    h.tick(100)
    assert signals(h) == (0, 0, 1) and h.log[-1] == ("c1", "a1")


def test_an_idle_exclusive_group_is_held_and_costs_no_look(make):
    h = make(durable=False)
    h.attach("c1", 10)
    h.send("a", "a1")
    h.accept("a1")
    assert signals(h) == (0, 0, 1)


ops = st.lists(st.one_of(
    st.tuples(st.just("send"), st.sampled_from("abcd")),
    st.tuples(st.just("attach"), st.sampled_from(["c1", "c2", "c3"])),
    st.tuples(st.just("detach"), st.sampled_from(["c1", "c2", "c3"])),
    st.tuples(st.just("credit"), st.sampled_from(["c1", "c2", "c3"]), st.integers(0, 3)),
    st.tuples(st.just("accept"), st.integers(0, 5)),
    st.tuples(st.just("fail"), st.integers(0, 5)),
    st.tuples(st.just("reset"), st.sampled_from("abcd")),
    st.tuples(st.just("hold"), st.sampled_from("abcd")),
    st.tuples(st.just("release"), st.sampled_from("abcd")),
    st.tuples(st.just("tick"), st.integers(1, 60)),
), max_size=40)


@settings(max_examples=300, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ops, st.sampled_from(["exclusive", "shared"]))
def test_the_signals_agree_with_a_pass_over_every_group(make, steps, policy):
    h = make(durable=False, group_policy=policy, redelivery_delay_ms=50)
    attached: set = set()
    for step in steps:
        kind = step[0]
        if kind == "send":
            h.now_ms += 1
            h.send(step[1])
        elif kind == "attach" and step[1] not in attached:
            attached.add(step[1])
            h.attach(step[1])
        elif kind == "detach" and step[1] in attached:
            attached.discard(step[1])
            h.detach(step[1])
        elif kind == "credit" and step[1] in attached:
            h.credit(step[1], step[2])
        elif kind in ("accept", "fail") and h.unsettled:
            name = sorted(h.unsettled)[step[1] % len(h.unsettled)]
            h.accept(name) if kind == "accept" else h.modify(name)
        elif kind == "reset" and step[1] in h.queue.groups:
            h.reset(step[1])
        elif kind == "hold":
            h.queue.hold_group(step[1])
        elif kind == "release":
            effects: list = []
            h.queue.release_group(step[1], h.now_ms, effects)
            h._take(effects)
        elif kind == "tick":
            h.tick(h.now_ms + step[1])
        stats = h.stats()
        assert (stats["runnable_groups"], stats["blocked_groups"], stats["held_groups"],
                stats["oldest_head_enqueued_at_ms"]) == reference(h.queue), step
        if any(c.may_take for c in h.queue.consumers.values()):
            assert stats["runnable_groups"] == 0  # a consumer that may take would have been given it


def test_the_cost_at_a_million_waiting_groups_is_printed_for_the_header(capsys):
    """Not a bound (no wall-clock limits in unit tests): prints the figure group_signals.py's header states,
    measured on 100,000 groups and scaled."""
    broker = Broker()
    queue = broker.declare_queue(QueueSettings(name="q", durable=False))
    for index in range(100_000):
        broker.enqueue("q", Message(b"x", f"g{index}"), 1)
    started = time.perf_counter()
    stats = queue.stats()
    elapsed_s = time.perf_counter() - started
    assert stats["runnable_groups"] == 100_000
    with capsys.disabled():
        print(f"\ngroup signals: {elapsed_s * 10:.2f} s per million waiting groups (stats call)")


def test_a_group_whose_head_no_consumer_selects_is_blocked_not_runnable():
    import json

    from node.core.dispatch.selector import compile_selector
    from node.core.dispatch.selector_dispatch import MessageSelector

    broker = Broker()
    queue = broker.declare_queue(QueueSettings(name="q", durable=False))
    green = MessageSelector(compile_selector("colour = 'green'"), json.loads)
    broker.attach_consumer("q", "green", False, 0, selector=green)
    broker.set_credit("green", 10, 0)
    broker.enqueue("q", Message(json.dumps({"colour": "red"}).encode(), "r"), 0)
    broker.enqueue("q", Message(json.dumps({"colour": "green"}).encode(), "g"), 0)
    stats = queue.stats()
    assert (stats["runnable_groups"], stats["blocked_groups"], stats["held_groups"]) == (0, 1, 1)
