"""Hypothesis drives the Broker with random steps and `model.Model` judges every effect it returns.

Steps: sends (a few groups, some without group, some closing, some with a TTL), consumer and browser
arrivals, credit, the four outcomes, detaches, group resets, failed journal batches (Broker.take_back
of the latest sends), ticks, and time passing without a tick.
One machine per queue variant, so a failure names the settings it broke. Deterministic by default;
GROUPER_MODEL_EXPLORE=1 searches with fresh randomness, GROUPER_MODEL_SCALE=5 runs 5x the examples.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from model import Model
from node.core.dispatch.broker import Broker
from node.core.dispatch.message import Message, Outcome
from node.core.dispatch.settings import QueueSettings

CONSUMERS_MAX = 4
GROUPS = ["a", "b", "c", "d", None]
CLOSES = [False] * 7 + [True]  # closing often would keep most groups held
TTLS_MS = st.sampled_from([0, 0, 0, 0, 1, 10, 30, 60])
OUTCOMES = [(Outcome.ACCEPTED, False), (Outcome.RELEASED, False), (Outcome.MODIFIED, True),
            (Outcome.MODIFIED, False), (Outcome.REJECTED, False)]
EXPLORE = os.environ.get("GROUPER_MODEL_EXPLORE") == "1"
EXAMPLES_SCALE = float(os.environ.get("GROUPER_MODEL_SCALE", "1"))  # e.g. 5 for a longer search


class DispatchMachine(RuleBasedStateMachine):
    queue_settings = QueueSettings(name="q")

    def __init__(self):
        super().__init__()
        self.broker = Broker()
        self.queue = self.broker.declare_queue(self.queue_settings)
        if self.queue_settings.dead_letter_queue:  # else the broker creates q.DLQ at the first dead letter
            self.broker.declare_queue(QueueSettings(name=self.queue_settings.dead_letter_queue))
        self.model = Model(self.queue_settings)
        self.now_ms = 0
        self.consumers_made = 0
        self.sent: dict[int, Message] = {}  # seq -> the Message the broker took, in send order
        self.batch_failed: set[int] = set()  # seqs of failed journal batches (each fails at most once)

    def step(self, call, tell_model, *, dispatches: bool = True, ticked: bool = False) -> None:
        """Call the core, tell the model what was asked, then let it judge the effects."""
        self.model.begin(self.now_ms, dispatches=dispatches)
        effects = call()
        tell_model()
        self.model.apply(effects)
        self.model.end(self.queue, self.broker.queues.get(self.queue_settings.dead_letter_queue_name), ticked=ticked)

    def attached(self, browse: bool) -> list:
        return sorted((cid for cid, c in self.model.consumers.items() if c.browse == browse), key=str)

    # ---- producers ---------------------------------------------------------------------------

    def send_one(self, group, closes: bool, ttl_ms: int) -> None:
        seq = self.broker.next_seq
        payload = f"m{seq}".encode()
        expires_at_ms = self.now_ms + ttl_ms if ttl_ms else 0
        message = Message(payload, group, expires_at_ms=expires_at_ms, closes_group=closes)
        self.step(lambda: self.broker.enqueue("q", message, self.now_ms),
                  lambda: self.model.sent(seq, payload, group, expires_at_ms, closes))
        self.sent[seq] = message

    @rule(group=st.sampled_from(GROUPS), closes=st.sampled_from(CLOSES), ttl_ms=TTLS_MS)
    def send(self, group, closes, ttl_ms):
        self.send_one(group, closes, ttl_ms)

    @rule(batch=st.lists(st.tuples(st.sampled_from(GROUPS), st.sampled_from(CLOSES), TTLS_MS),
                         min_size=2, max_size=6))
    def send_several(self, batch):
        for group, closes, ttl_ms in batch:
            self.send_one(group, closes, ttl_ms)

    # ---- consumers ---------------------------------------------------------------------------

    @initialize(credits=st.lists(st.integers(0, 5), max_size=2))
    def first_consumers(self, credits):
        for credit in credits:
            self.attach(credit)

    @precondition(lambda self: len(self.attached(False)) < CONSUMERS_MAX)
    @rule(credit=st.integers(0, 5))
    def attach(self, credit):
        self.consumers_made += 1
        cid = f"c{self.consumers_made}"
        self.step(lambda: self.broker.attach_consumer("q", cid, False, self.now_ms),
                  lambda: self.model.attached(cid, False))
        if credit:  # an AMQP receiver attaches first and grants credit after
            self.step(lambda: self.broker.set_credit(cid, credit, self.now_ms),
                      lambda: self.model.credited(cid, credit))

    @precondition(lambda self: not self.attached(True))
    @rule(credit=st.integers(0, 3))
    def attach_browser(self, credit):
        self.consumers_made += 1
        cid = f"v{self.consumers_made}"
        self.step(lambda: self.broker.attach_consumer("q", cid, True, self.now_ms),
                  lambda: self.model.attached(cid, True), dispatches=False)
        self.step(lambda: self.broker.set_credit(cid, credit, self.now_ms),
                  lambda: self.model.credited(cid, credit))

    @precondition(lambda self: self.model.consumers)
    @rule(index=st.integers(0, 100), credit=st.integers(0, 6))
    def set_credit(self, index, credit):
        everyone = sorted(self.model.consumers, key=str)
        cid = everyone[index % len(everyone)]
        self.step(lambda: self.broker.set_credit(cid, credit, self.now_ms),
                  lambda: self.model.credited(cid, credit))

    @precondition(lambda self: self.model.consumers)
    @rule(index=st.integers(0, 100))
    def detach(self, index):
        everyone = sorted(self.model.consumers, key=str)
        cid = everyone[index % len(everyone)]
        self.step(lambda: self.broker.detach_consumer(cid, self.now_ms),
                  lambda: self.model.detached(cid), dispatches=not self.model.consumers[cid].browse)

    @precondition(lambda self: self.model.unsettled())
    @rule(index=st.integers(0, 100), outcome=st.sampled_from(OUTCOMES))
    def settle(self, index, outcome):
        unsettled = self.model.unsettled()
        cid, delivery_id = unsettled[index % len(unsettled)]
        kind, failed = outcome
        self.step(lambda: self.broker.settle(cid, delivery_id, kind, self.now_ms, failed),
                  lambda: self.model.settled(cid, delivery_id, kind, failed))

    @precondition(lambda self: self.model.unsettled())
    @rule(index=st.integers(0, 100))
    def accept_oldest_and_top_up(self, index):
        """A well-behaved receiver: settle in order, then top its credit up again by one."""
        holders = sorted({cid for cid, _ in self.model.unsettled()}, key=str)
        cid = holders[index % len(holders)]
        delivery_id = min(self.model.consumers[cid].unsettled)
        self.step(lambda: self.broker.settle(cid, delivery_id, Outcome.ACCEPTED, self.now_ms),
                  lambda: self.model.settled(cid, delivery_id, Outcome.ACCEPTED, False))
        credit = self.model.consumers[cid].credit + 1
        self.step(lambda: self.broker.set_credit(cid, credit, self.now_ms),
                  lambda: self.model.credited(cid, credit))

    # ---- a failed journal batch ----------------------------------------------------------------

    @precondition(lambda self: len(self.sent) > len(self.batch_failed))
    @rule(count=st.integers(1, 4))
    def journal_batch_fails(self, count):
        """The journal batch holding the latest `count` sends not in a failed batch yet was not written."""
        self.take_back([seq for seq in self.sent if seq not in self.batch_failed][-count:])

    def take_back(self, seqs: list[int]) -> None:
        self.batch_failed.update(seqs)
        answer: list = []

        def call():
            handed_out, effects = self.broker.take_back([("q", self.sent[seq]) for seq in seqs], self.now_ms)
            answer.append(handed_out)
            return effects
        self.step(call, lambda: self.model.taken_back(seqs, answer[0]))

    # ---- management and time -----------------------------------------------------------------

    @rule()
    def reset_all_groups(self):
        self.step(lambda: self.broker.reset_groups("q", None, self.now_ms)[1],
                  lambda: self.model.reset(None))

    @precondition(lambda self: self.model.existing_keys())
    @rule(index=st.integers(0, 100))
    def reset_one_group(self, index):
        keys = self.model.existing_keys()
        key = keys[index % len(keys)]
        self.step(lambda: self.broker.reset_groups("q", str(key), self.now_ms)[1],
                  lambda: self.model.reset(key))

    @rule(advance_ms=st.integers(0, 30))
    def tick(self, advance_ms):
        self.now_ms += advance_ms
        self.step(lambda: self.broker.tick(self.now_ms), lambda: None, ticked=True)

    @rule(advance_ms=st.integers(1, 30))
    def time_passes_without_a_tick(self, advance_ms):
        self.now_ms += advance_ms  # the next call sees the new time before any tick does


def machine_for(name: str, examples: int, **queue_settings):
    machine = type(name, (DispatchMachine,), {
        "queue_settings": QueueSettings(name="q", **queue_settings).validate()})
    test_case = machine.TestCase
    test_case.settings = settings(
        max_examples=max(1, int(examples * EXAMPLES_SCALE)), stateful_step_count=40, deadline=None,
        database=None, derandomize=not EXPLORE, suppress_health_check=[HealthCheck.too_slow],
    )
    return test_case


TestExclusive = machine_for("Exclusive", 150, group_policy="exclusive", dead_letter_queue="dlq")
TestShared = machine_for("Shared", 150, group_policy="shared", delivery_count_max=2, dead_letter_queue="dlq")
TestNone = machine_for("None", 100, group_policy="none", dead_letter_queue="dlq", durable=False)
TestExclusiveBucketsAndDefaultGroup = machine_for(
    "ExclusiveBucketsAndDefaultGroup", 100, group_policy="exclusive", group_buckets=3, default_group="dg")
TestExclusiveRebalancePaused = machine_for(
    "ExclusiveRebalancePaused", 150, group_policy="exclusive", group_rebalance=True,
    group_rebalance_pause_dispatch=True, time_before_dispatch_ms=20, delivery_count_max=3,
    dead_letter_queue="dlq")
TestSharedRebalancePausedHeldDispatch = machine_for(
    "SharedRebalancePausedHeldDispatch", 150, group_policy="shared", group_rebalance=True,
    group_rebalance_pause_dispatch=True, consumers_before_dispatch=2, group_buckets=2)
TestExclusiveRebalanceUnpaused = machine_for(
    "ExclusiveRebalanceUnpaused", 60, group_policy="exclusive", group_rebalance=True)
TestBucketsZero = machine_for("BucketsZero", 50, group_policy="exclusive", group_buckets=0)
# poison messages: a growing redelivery delay, a low limit and the auto-created q.DLQ
TestSharedRedeliveryDelay = machine_for(
    "SharedRedeliveryDelay", 100, group_policy="shared", delivery_count_max=3, redelivery_delay_ms=5,
    redelivery_delay_multiplier=2.0)
TestExclusiveRedeliveryDelay = machine_for(
    "ExclusiveRedeliveryDelay", 100, group_policy="exclusive", redelivery_delay_ms=7)
