"""Hypothesis drives local transactions (node/core/dispatch/transactions.py, applied by the node shell) with
random sends, transactional sends and accepts, commits, rollbacks, coordinator drops and consumer detaches,
and a reference model judges every effect (issue 31).

The model: a message is live (in the queue, delivered or not) from its send, or its transaction's commit,
until an accept takes effect (at once, or at its transaction's commit). Checked after every step:
- the queue holds exactly the live messages; a rolled-back send never reaches a consumer;
- a delivery held by an open transaction is not delivered again (its group stays with its consumer)
  until the transaction ends;
- a rollback gives each delivery it held back with its delivery count raised by one, and each group's
  messages are delivered in send order within a step;
- a commit is accepted (AcceptSend at the batch's end), or refused with TransactionRolledBack exactly
  when a consumer whose delivery it held detached first, and then leaves no trace.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from node.core.dispatch.broker import Broker
from node.core.dispatch.message import Message, Outcome
from node.core.dispatch.settings import QueueSettings
from node.core.dispatch.transactions import TransactionRolledBack, Transactions
from node.core.durability import Durability
from node.core.effects import AcceptSend, Deliver, Refuse
from node.core.shell import NodeShell

GROUPS = ["a", "b", "c", None]
CONTROLLERS = [101, 102]
CREDIT = 10_000  # every consumer can always take more: a live message not delivered is one held back


class TransactionMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.broker = Broker()
        self.queue = self.broker.declare_queue(QueueSettings(name="q", delivery_count_max=0))
        self.shell = NodeShell(self.broker, Durability(1000), journalled=False)
        self.transactions = Transactions()
        self.now_ms = 0
        self.next_body = 0
        self.live: set[bytes] = set()
        self.outstanding: dict[tuple[int, int], bytes] = {}  # (consumer, delivery id) -> body
        self.count: dict[bytes, int] = {}  # body -> its delivery count at its last delivery
        self.expected_count: dict[bytes, int] = {}  # body -> the count its next delivery must carry
        self.seq_of: dict[bytes, int] = {}
        self.open: dict[bytes, dict] = {}  # transaction id -> {"controller", "sends", "accepts", "doomed"}
        self.consumers = [1, 2]
        self.next_consumer = 3
        for consumer_id in self.consumers:
            self.run(self.broker.attach_consumer("q", consumer_id, False, self.now_ms))
            self.run(self.broker.set_credit(consumer_id, CREDIT, self.now_ms))

    def run(self, effects: list) -> list:
        delivered_by_group: dict = {}
        for effect in effects:
            if type(effect) is not Deliver:
                continue
            body = effect.message.payload
            assert body in self.live, f"{body} delivered but not live (a rolled-back send, or accepted)"
            assert body not in self.outstanding.values(), f"{body} delivered again while still held"
            expected = self.expected_count.pop(body, None)
            if expected is not None:
                assert effect.message.delivery_count == expected, (body, effect.message.delivery_count, expected)
            self.count[body] = effect.message.delivery_count
            self.outstanding[(effect.consumer_id, effect.delivery_id)] = body
            group = effect.message.group_id
            if group is not None:
                assert delivered_by_group.get(group, -1) < effect.message.seq, f"group {group} out of order"
                delivered_by_group[group] = effect.message.seq
                self.seq_of[body] = effect.message.seq
        return effects

    def held(self) -> set:
        return {key for record in self.open.values() for key, _ in record["accepts"]}

    def free_deliveries(self) -> list:
        held = self.held()
        return sorted(key for key in self.outstanding if key not in held)

    def message(self, group) -> Message:
        self.next_body += 1
        return Message(f"m{self.next_body}".encode(), group)

    # ---- outside transactions -------------------------------------------------------------------

    @rule(group=st.sampled_from(GROUPS))
    def send(self, group):
        message = self.message(group)
        self.live.add(message.payload)
        self.run(self.shell.enqueue_local(("send", message.payload), "q", message, False, False, self.now_ms))

    @precondition(lambda self: self.free_deliveries())
    @rule(data=st.data())
    def accept(self, data):
        key = data.draw(st.sampled_from(self.free_deliveries()))
        body = self.outstanding.pop(key)
        self.live.discard(body)
        self.run(self.broker.settle(*key, Outcome.ACCEPTED, self.now_ms))

    @rule(index=st.integers(0, 1))
    def detach_and_attach_again(self, index):
        consumer_id = self.consumers[index]
        self.transactions.consumer_gone(consumer_id)
        for record in self.open.values():
            if any(key[0] == consumer_id for key, _ in record["accepts"]):
                record["doomed"] = True
        for key in [key for key in self.outstanding if key[0] == consumer_id]:
            self.expected_count.pop(self.outstanding.pop(key), None)
        self.run(self.broker.detach_consumer(consumer_id, self.now_ms))
        fresh = self.next_consumer
        self.next_consumer += 1
        self.consumers[index] = fresh
        self.run(self.broker.attach_consumer("q", fresh, False, self.now_ms))
        self.run(self.broker.set_credit(fresh, CREDIT, self.now_ms))

    # ---- transactions ----------------------------------------------------------------------------

    @rule(controller=st.sampled_from(CONTROLLERS))
    def declare(self, controller):
        transaction_id = self.transactions.declare(controller)
        assert transaction_id not in self.open
        self.open[transaction_id] = {"controller": controller, "sends": [], "accepts": [], "doomed": False}

    @precondition(lambda self: self.open)
    @rule(data=st.data(), group=st.sampled_from(GROUPS))
    def send_in_transaction(self, data, group):
        transaction_id = data.draw(st.sampled_from(sorted(self.open)))
        message = self.message(group)
        self.transactions.send(transaction_id, "q", message, False, None, None)
        self.open[transaction_id]["sends"].append(message.payload)

    @precondition(lambda self: self.open and self.free_deliveries())
    @rule(data=st.data())
    def accept_in_transaction(self, data):
        transaction_id = data.draw(st.sampled_from(sorted(self.open)))
        key = data.draw(st.sampled_from(self.free_deliveries()))
        self.transactions.settle(transaction_id, *key, Outcome.ACCEPTED, False, key)
        self.open[transaction_id]["accepts"].append((key, self.outstanding[key]))

    @precondition(lambda self: self.open and len(self.free_deliveries()) > 1)
    @rule(data=st.data())
    def accept_several_in_transaction(self, data):
        """Several at once, in any order: a consumer may settle a newer delivery before an older one."""
        transaction_id = data.draw(st.sampled_from(sorted(self.open)))
        keys = data.draw(st.permutations(self.free_deliveries()))[:4]
        for key in keys:
            self.transactions.settle(transaction_id, *key, Outcome.ACCEPTED, False, key)
            self.open[transaction_id]["accepts"].append((key, self.outstanding[key]))

    @precondition(lambda self: self.open)
    @rule(data=st.data())
    def commit(self, data):
        transaction_id = data.draw(st.sampled_from(sorted(self.open)))
        record = self.open.pop(transaction_id)
        transaction = self.transactions.discharge(transaction_id, record["controller"])
        effects = self.shell.commit(transaction, ("discharge", transaction_id), self.now_ms)
        refused = [e for e in effects if type(e) is Refuse and e.incoming == ("discharge", transaction_id)]
        if record["doomed"]:
            assert len(refused) == 1 and isinstance(refused[0].error, TransactionRolledBack)
            self.rolled_back(record, effects)
            return
        assert not refused
        self.live.update(record["sends"])
        for key, body in record["accepts"]:
            self.outstanding.pop(key)
            self.live.discard(body)
        self.run(effects)
        ended = self.shell.end_batch(self.now_ms)
        assert AcceptSend(("discharge", transaction_id)) in ended

    @precondition(lambda self: self.open)
    @rule(data=st.data())
    def roll_back(self, data):
        transaction_id = data.draw(st.sampled_from(sorted(self.open)))
        record = self.open.pop(transaction_id)
        transaction = self.transactions.discharge(transaction_id, record["controller"])
        self.rolled_back(record, self.shell.roll_back(transaction, self.now_ms))

    @rule(controller=st.sampled_from(CONTROLLERS))
    def coordinator_dropped(self, controller):
        ended = self.transactions.controller_ended(controller)
        assert sorted(t.id for t in ended) == sorted(i for i, r in self.open.items() if r["controller"] == controller)
        for transaction in ended:
            self.rolled_back(self.open.pop(transaction.id), self.shell.roll_back(transaction, self.now_ms))

    def rolled_back(self, record: dict, effects: list) -> None:
        for key, body in record["accepts"]:
            if self.outstanding.pop(key, None) is not None:  # not given back already by a detach
                self.expected_count[body] = self.count[body] + 1
        self.run(effects)

    @invariant()
    def the_queue_holds_exactly_the_live_messages(self):
        assert self.queue.depth_messages == len(self.live)
        assert set(self.outstanding.values()) <= self.live
        assert len(self.transactions) == len(self.open)

    @invariant()
    def every_live_message_is_delivered_with_so_much_credit(self):
        assert set(self.outstanding.values()) == self.live


TestTransactions = TransactionMachine.TestCase
TestTransactions.settings = settings(max_examples=300, stateful_step_count=40, deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow])
