"""JMS selectors in group dispatch, judged by hypothesis against a naive reference model.

Random messages (a group or none, a colour or none, a number or none), consumers with selectors (or
none), credit, outcomes and detaches. The model evaluates each selector with a plain Python predicate of
its own (not the selector engine) and holds the core to docs/selectors.md, "Groups and selectors":
- a message goes only to a consumer whose selector selects it, never to one that refuses it;
- a consumer whose selector is exactly `JMSXGroupID = 'a'` chose group a: while it is attached (the
  first attached of such consumers), no other consumer receives a message of group a;
- within a group, nothing is delivered while an earlier message of the group is available or is
  unsettled at another consumer: each consumer sees the group's messages it selects in group order;
- nothing is lost or duplicated: every message is queued, in flight once, or accepted;
- liveness after every step: no consumer with credit is left without a message it selects that it may
  take (an ungrouped one, or the head of a group nobody holds, or of a group it holds), and a group
  whose head its consumer refuses is not held back by it (unless that consumer has no credit: it keeps
  what it has, as without selectors).
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from node.core.dispatch.broker import Broker
from node.core.dispatch.message import Message, Outcome
from node.core.dispatch.selector import compile_selector
from node.core.dispatch.selector_dispatch import UNGROUPED_FIELDS_KEPT_MAX, MessageSelector
from node.core.dispatch.settings import QueueSettings
from node.core.effects import Deliver

SELECTORS = {  # selector text -> the model's own reading of it
    None: lambda fields: True,
    "colour = 'green'": lambda fields: fields.get("colour") == "green",
    "colour <> 'green'": lambda fields: fields.get("colour") is not None and fields["colour"] != "green",
    "n > 2": lambda fields: fields.get("n") is not None and fields["n"] > 2,
    "JMSXGroupID = 'a'": lambda fields: fields.get("JMSXGroupID") == "a",
    "colour IN ('red', 'blue') OR n = 0":
        lambda fields: fields.get("colour") in ("red", "blue") or fields.get("n") == 0,
}
CHOOSING_A = "JMSXGroupID = 'a'"  # a consumer with this selector is group a's consumer
SHARED_DEFAULT_GROUP = "qpid.no-group"  # what a shared queue groups messages without a group id under


def read_fields(payload: bytes) -> dict:
    return json.loads(payload)


class SelectorDispatch(RuleBasedStateMachine):
    policy = "exclusive"

    @initialize()
    def start(self):
        self.broker = Broker()
        self.queue = self.broker.declare_queue(QueueSettings(name="q", group_policy=self.policy))
        self.now_ms = 0
        self.next_id = 0
        self.fields: dict[int, dict] = {}  # seq -> the message's fields
        self.group_of: dict[int, object] = {}  # seq -> group key (None: ungrouped)
        self.available: set[int] = set()
        self.in_flight: dict[int, tuple] = {}  # seq -> (consumer id, delivery id)
        self.selectors: dict[int, str | None] = {}  # consumer id -> selector text
        self.credit: dict[int, int] = {}
        self.unsettled: dict[int, list[int]] = {}  # consumer id -> delivery ids

    def judge(self, effects: list) -> None:
        for effect in effects:
            if not isinstance(effect, Deliver):
                continue
            consumer, seq = effect.consumer_id, effect.message.seq
            assert seq in self.available, f"seq {seq} delivered to {consumer} while not available"
            assert self.selects(consumer, seq), \
                f"seq {seq} {self.fields[seq]} delivered to {consumer}, whose selector {self.selectors[consumer]!r} " \
                f"refuses it (or another consumer chose its group)"
            assert self.credit[consumer] > 0, f"seq {seq} delivered to {consumer} without credit"
            group = self.group_of[seq]
            if group is not None:
                earlier = [other for other in self.available if other < seq and self.group_of[other] == group]
                assert not earlier, f"seq {seq} of group {group} overtook available {earlier}"
                elsewhere = [other for other, (holder, _) in self.in_flight.items()
                             if self.group_of[other] == group and holder != consumer]
                assert not elsewhere, \
                    f"seq {seq} of group {group} delivered to {consumer} while {elsewhere} in flight elsewhere"
            self.available.discard(seq)
            self.in_flight[seq] = (consumer, effect.delivery_id)
            self.credit[consumer] -= 1
            self.unsettled[consumer].append(effect.delivery_id)

    def chooser(self, group):
        """The consumer that chose `group` (the first attached with CHOOSING_A for group a), or None."""
        choosers = sorted(c for c, text in self.selectors.items() if text == CHOOSING_A)
        return choosers[0] if group == "a" and choosers else None

    def selects(self, consumer, seq) -> bool:
        chooser = self.chooser(self.group_of[seq])
        if chooser is not None and chooser != consumer:
            return False
        return SELECTORS[self.selectors[consumer]](self.fields[seq])

    # ---- steps --------------------------------------------------------------------------------

    @rule(group=st.sampled_from(["a", "b", "c", None]), colour=st.sampled_from(["green", "red", "blue", None]),
          n=st.sampled_from([0, 1, 3, None]))
    def send(self, group, colour, n):
        fields = {key: value for key, value in (("colour", colour), ("n", n), ("JMSXGroupID", group))
                  if value is not None}
        message = Message(json.dumps(fields).encode(), group)
        effects = self.broker.enqueue("q", message, self.now_ms)
        seq = message.seq
        self.fields[seq] = fields
        self.group_of[seq] = group if group is not None else (SHARED_DEFAULT_GROUP if self.policy == "shared" else None)
        self.available.add(seq)
        self.judge(effects)

    @precondition(lambda self: len(self.selectors) < 4)
    @rule(text=st.sampled_from(list(SELECTORS)))
    def attach(self, text):
        consumer = self.next_id
        self.next_id += 1
        self.selectors[consumer] = text
        self.credit[consumer] = 0
        self.unsettled[consumer] = []
        selector = None if text is None else MessageSelector(compile_selector(text), read_fields)
        self.judge(self.broker.attach_consumer("q", consumer, False, self.now_ms, selector=selector))

    @precondition(lambda self: self.selectors)
    @rule(data=st.data(), credit=st.integers(0, 3))
    def flow(self, data, credit):
        consumer = data.draw(st.sampled_from(sorted(self.selectors)))
        self.credit[consumer] = credit
        self.judge(self.broker.set_credit(consumer, credit, self.now_ms))

    @precondition(lambda self: self.in_flight)
    @rule(data=st.data(), outcome=st.sampled_from([(Outcome.ACCEPTED, False), (Outcome.RELEASED, False),
                                                   (Outcome.MODIFIED, True)]))
    def settle(self, data, outcome):
        seq = data.draw(st.sampled_from(sorted(self.in_flight)))
        consumer, delivery_id = self.in_flight.pop(seq)
        self.unsettled[consumer].remove(delivery_id)
        if outcome[0] is not Outcome.ACCEPTED:
            self.available.add(seq)
        self.judge(self.broker.settle(consumer, delivery_id, outcome[0], self.now_ms, outcome[1]))

    @precondition(lambda self: self.selectors)
    @rule(data=st.data())
    def detach(self, data):
        consumer = data.draw(st.sampled_from(sorted(self.selectors)))
        for seq, (holder, _) in list(self.in_flight.items()):
            if holder == consumer:
                del self.in_flight[seq]
                self.available.add(seq)
        del self.selectors[consumer], self.credit[consumer], self.unsettled[consumer]
        self.judge(self.broker.detach_consumer(consumer, self.now_ms))

    @rule()
    def time_passes(self):  # a redelivery delay (none by default) or a tick: dispatch runs again
        self.now_ms += 10
        self.judge(self.broker.tick(self.now_ms))

    # ---- what must hold after every step --------------------------------------------------------

    @invariant()
    def nothing_lost_or_duplicated(self):
        if not hasattr(self, "queue"):
            return
        queued = {message.seq for message in self.queue._store.log if message.state != 2}
        assert not (self.available & set(self.in_flight)), "a message both available and in flight"
        assert queued >= self.available | set(self.in_flight), \
            f"lost: {sorted((self.available | set(self.in_flight)) - queued)}"

    @invariant()
    def no_taker_waits_for_a_message_it_selects(self):
        if not hasattr(self, "queue"):
            return
        takers = [consumer for consumer, credit in self.credit.items() if credit > 0]
        groups = self.queue.groups
        heads: dict = {}
        for seq in sorted(self.available):
            group = self.group_of[seq]
            if group is None:
                choosers = [c for c in takers if self.selects(c, seq)]
                assert not choosers, f"ungrouped seq {seq} {self.fields[seq]} waits while {choosers} select it"
            else:
                heads.setdefault(group, seq)
        for group, seq in heads.items():
            holders = {holder for other, (holder, _) in self.in_flight.items() if self.group_of[other] == group}
            owner = groups[group].consumer.id if group in groups and groups[group].consumer is not None else None
            choosers = [c for c in takers if self.selects(c, seq)]
            if holders:
                (holder,) = holders
                if holder in choosers:
                    assert groups[group].paused, \
                        f"group {group}'s head {seq} waits while its holder {holder} selects it"
            elif owner is not None and self.credit[owner] == 0 and self.chooser(group) in (None, owner):
                continue  # a consumer without credit keeps its groups, as without selectors, unless chosen
            else:
                assert not choosers, f"group {group}'s head {seq} {self.fields[seq]} waits while {choosers} select it"


class SharedSelectorDispatch(SelectorDispatch):
    policy = "shared"


EXAMPLES = settings(max_examples=150, stateful_step_count=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
TestExclusiveSelectorDispatch = SelectorDispatch.TestCase
TestExclusiveSelectorDispatch.settings = EXAMPLES
TestSharedSelectorDispatch = SharedSelectorDispatch.TestCase
TestSharedSelectorDispatch.settings = EXAMPLES


# ---- examples ---------------------------------------------------------------------------------------


def deliveries(effects: list) -> list[tuple]:
    return [(effect.consumer_id, json.loads(effect.message.payload)["n"]) for effect in effects
            if isinstance(effect, Deliver)]


def selecting(text: str) -> MessageSelector:
    return MessageSelector(compile_selector(text), read_fields)


def send(broker: Broker, group, n: int, colour: str = "green") -> list:
    fields = {"n": n, "colour": colour, **({"JMSXGroupID": group} if group else {})}
    return broker.enqueue("q", Message(json.dumps(fields).encode(), group), 0)


def test_a_group_whose_head_its_consumer_refuses_goes_to_one_that_selects_it_once_settled():
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q"))
    broker.attach_consumer("q", "green", False, 0, selector=selecting("colour = 'green'"))
    broker.attach_consumer("q", "red", False, 0, selector=selecting("colour = 'red'"))
    broker.set_credit("green", 10, 0)
    broker.set_credit("red", 10, 0)
    assert deliveries(send(broker, "g", 0, "green")) == [("green", 0)]
    assert deliveries(send(broker, "g", 1, "red")) == []  # waits: message 0 is unsettled at green
    assert deliveries(send(broker, "g", 2, "green")) == []  # behind message 1, in group order
    assert deliveries(broker.settle("green", 0, Outcome.ACCEPTED, 0)) == [("red", 1)]
    assert deliveries(broker.settle("red", 0, Outcome.ACCEPTED, 0)) == [("green", 2)]


def test_a_group_nobody_selects_waits_without_delaying_other_groups_until_a_consumer_attaches():
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q"))
    broker.attach_consumer("q", "green", False, 0, selector=selecting("colour = 'green'"))
    broker.set_credit("green", 10, 0)
    assert deliveries(send(broker, "blue-group", 0, "blue")) == []
    assert deliveries(send(broker, "blue-group", 1, "green")) == []  # behind its blue head
    assert deliveries(send(broker, "other", 2, "green")) == [("green", 2)]
    broker.attach_consumer("q", "blue", False, 0, selector=selecting("colour = 'blue'"))
    assert deliveries(broker.set_credit("blue", 10, 0)) == [("blue", 0)]
    assert deliveries(broker.settle("blue", 0, Outcome.ACCEPTED, 0)) == [("green", 1)]


def test_a_consumer_choosing_a_group_takes_it_from_its_consumer_once_that_one_settled():
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q"))
    broker.attach_consumer("q", "any", False, 0)
    broker.set_credit("any", 10, 0)
    assert deliveries(send(broker, "X", 0)) == [("any", 0)]
    broker.attach_consumer("q", "x", False, 0, selector=selecting("JMSXGroupID = 'X'"))
    broker.set_credit("x", 10, 0)
    assert deliveries(send(broker, "X", 1)) == []  # message 0 is unsettled at "any": X moves once it is settled
    assert deliveries(send(broker, "Y", 2)) == [("any", 2)]
    assert deliveries(broker.settle("any", 0, Outcome.ACCEPTED, 0)) == [("x", 1)]
    assert deliveries(send(broker, "X", 3)) == [("x", 3)]
    broker.detach_consumer("x", 0)  # a chosen group is free for the others again when its consumer leaves
    assert deliveries(send(broker, "X", 4)) == [("any", 4)]


def test_a_consumer_choosing_a_group_takes_it_from_a_consumer_without_credit():
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q"))
    broker.attach_consumer("q", "any", False, 0)
    broker.set_credit("any", 1, 0)
    assert deliveries(send(broker, "X", 0)) == [("any", 0)]
    broker.settle("any", 0, Outcome.ACCEPTED, 0)  # "any" keeps X (exclusive) and has no credit left
    broker.attach_consumer("q", "x", False, 0, selector=selecting("JMSXGroupID = 'X'"))
    broker.set_credit("x", 10, 0)
    assert deliveries(send(broker, "X", 1)) == [("x", 1)]


def test_a_chosen_group_waits_for_its_consumer_rather_than_go_to_another():
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q"))
    broker.attach_consumer("q", "x", False, 0, selector=selecting("'X' = JMSXGroupID"))
    broker.attach_consumer("q", "any", False, 0)
    broker.set_credit("any", 10, 0)
    assert deliveries(send(broker, "X", 0)) == []
    assert deliveries(broker.set_credit("x", 1, 0)) == [("x", 0)]


def test_only_a_selector_that_is_exactly_one_group_id_chooses_a_group():
    assert compile_selector("JMSXGroupID = 'X'").group_id == "X"
    assert compile_selector("('X' = JMSXGroupID)").group_id == "X"
    for text in ("JMSXGroupID = 'X' AND a = 1", "JMSXGroupID <> 'X'", "JMSXGroupID = 1", "JMSXGroupSeq = 'X'",
                 "JMSXGroupID IN ('X')"):
        assert compile_selector(text).group_id is None, text


def test_a_browser_with_a_selector_sees_only_what_it_selects():
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q"))
    for n, colour in enumerate(["red", "green", "blue", "green"]):
        send(broker, None, n, colour)
    broker.attach_consumer("q", "browser", True, 0, selector=selecting("colour = 'green'"))
    assert deliveries(broker.set_credit("browser", 10, 0)) == [("browser", 1), ("browser", 3)]
    assert deliveries(send(broker, "g", 4, "red") + send(broker, "g", 5, "green")) == [("browser", 5)]


def test_what_a_selector_read_is_kept_only_by_candidates_and_only_so_many_unselected_ones():
    broker = Broker()
    queue = broker.declare_queue(QueueSettings(name="q"))
    broker.attach_consumer("q", "green", False, 0, selector=selecting("colour = 'green'"))
    broker.set_credit("green", 10, 0)
    for n in range(UNGROUPED_FIELDS_KEPT_MAX + 100):
        send(broker, None, n, "red")
    [delivered] = [effect.message for effect in send(broker, None, -1, "green") if isinstance(effect, Deliver)]
    assert delivered.fields is None  # in flight: read again only if it comes back
    kept = [message for message in queue._store.log if message.fields is not None]
    assert len(kept) == UNGROUPED_FIELDS_KEPT_MAX
