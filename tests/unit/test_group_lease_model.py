"""Group leases (issue 30) judged by the reference model: hypothesis drives the Broker with the steps of
test_dispatch_model (sends, credit, the four outcomes, attach and detach, resets, ticks, time passing)
plus long silences, and `LeaseModel` predicts which consumers lose their lease at each tick.

The lease rules the model holds the core to, on top of every dispatch rule of model.py:
- a consumer's lease runs while it holds unsettled deliveries; it starts at the delivery that finds it
  holding none and every settlement or flow renews it; at a tick, exactly the consumers silent for
  group_lease_ms or longer while holding deliveries are detached (DetachConsumer, GroupLeaseExpired
  naming the queue, the group of the oldest delivery and the lease): one that keeps settling keeps its groups;
- a lapsed consumer's deliveries come back as at a detach: delivery count raised, back at their place in
  their groups, before any later message of the group goes to anyone (model.py checks order and counts);
- no group ever has two consumers (model.py's owner checks).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import rule

from model import Model, expect
from node.core.dispatch.settings import QueueSettings
from node.core.effects import DetachConsumer
from node.core.errors import GroupLeaseExpired
from test_dispatch_model import EXAMPLES_SCALE, EXPLORE, DispatchMachine

LEASE_MS = 40


class LeaseModel(Model):
    def __init__(self, queue_settings: QueueSettings):
        super().__init__(queue_settings)
        self.lease_ms = queue_settings.group_lease_ms
        self.renewed_ms: dict = {}  # consumer id -> its last renewal (or the delivery that started its lease)
        self.lapsing: set = set()  # consumers the tick under way must detach
        self.lapsed_total = 0

    def expect_lapses(self) -> None:
        self.lapsing = {cid for cid, consumer in self.consumers.items()
                        if consumer.unsettled and self.renewed_ms[cid] + self.lease_ms <= self.now_ms}
        for cid in self.lapsing:
            self.consumers[cid].credit = 0  # it takes nothing more before it is detached

    def settled(self, consumer_id, delivery_id, outcome, delivery_failed) -> None:
        self.renewed_ms[consumer_id] = self.now_ms
        super().settled(consumer_id, delivery_id, outcome, delivery_failed)

    def credited(self, consumer_id, credit: int) -> None:
        self.renewed_ms[consumer_id] = self.now_ms
        super().credited(consumer_id, credit)

    def _deliver(self, effect) -> None:
        consumer = self.consumers.get(effect.consumer_id)
        if consumer is not None and not consumer.unsettled:
            self.renewed_ms[effect.consumer_id] = self.now_ms  # its lease starts
        super()._deliver(effect)

    def apply(self, effects: list) -> None:
        for effect in effects:
            if isinstance(effect, DetachConsumer):
                self._lapsed(effect)
            else:
                super().apply([effect])
        expect(not self.lapsing, f"leases of {sorted(self.lapsing)} lapsed at {self.now_ms} and were kept")

    def _lapsed(self, effect: DetachConsumer) -> None:
        cid = effect.consumer_id
        expect(cid in self.lapsing, f"{cid!r} detached at {self.now_ms}, renewed at {self.renewed_ms.get(cid)}, "
                                    f"lease {self.lease_ms} ms: it kept its lease")
        self.lapsing.discard(cid)
        error = effect.error
        consumer = self.consumers[cid]
        oldest = self.messages[next(iter(consumer.unsettled.values()))]
        expect(isinstance(error, GroupLeaseExpired) and error.queue == self.name and error.lease_ms == self.lease_ms
               and error.group == oldest.key, f"{cid!r} detached with {error!r}, oldest delivery {oldest}")
        self.lapsed_total += 1
        self.detached(cid)


class LeaseMachine(DispatchMachine):
    queue_settings = QueueSettings(name="q", group_lease_ms=LEASE_MS)

    def __init__(self):
        super().__init__()
        self.model = LeaseModel(self.queue_settings)

    @rule(advance_ms=st.integers(0, 30))
    def tick(self, advance_ms):
        self.now_ms += advance_ms
        self.step(lambda: self.broker.tick(self.now_ms), self.model.expect_lapses, ticked=True)

    @rule(advance_ms=st.sampled_from([LEASE_MS - 1, LEASE_MS, LEASE_MS + 1, 3 * LEASE_MS]))
    def silence_then_tick(self, advance_ms):
        """Nobody settles or flows for about a lease, then the node ticks."""
        self.tick(advance_ms)


def lease_machine_for(name: str, examples: int, **queue_settings):
    machine = type(name, (LeaseMachine,), {
        "queue_settings": QueueSettings(name="q", group_lease_ms=LEASE_MS, **queue_settings).validate()})
    test_case = machine.TestCase
    test_case.settings = settings(
        max_examples=max(1, int(examples * EXAMPLES_SCALE)), stateful_step_count=40, deadline=None,
        database=None, derandomize=not EXPLORE, suppress_health_check=[HealthCheck.too_slow],
    )
    return test_case


TestLeaseExclusive = lease_machine_for("LeaseExclusive", 150, group_policy="exclusive", dead_letter_queue="dlq")
TestLeaseShared = lease_machine_for("LeaseShared", 100, group_policy="shared", delivery_count_max=2,
                                    dead_letter_queue="dlq")
TestLeaseRedeliveryDelayPaused = lease_machine_for(
    "LeaseRedeliveryDelayPaused", 80, group_policy="exclusive", redelivery_delay_ms=7, group_rebalance=True,
    group_rebalance_pause_dispatch=True)
