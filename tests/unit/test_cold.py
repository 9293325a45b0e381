"""Cold tails (node/core/dispatch/cold.py): a durable queue's newest messages past the node's record budget.

The dispatch model (model.py) judges every step, as in test_dispatch_model.py, with a record budget so
small that most sends go cold; this harness is the journal. A STORE is on disk once a `journal_written`
step reports it (Broker.journalled), a failed batch takes back only sends not on disk yet, and a
ReadRecords is answered by `records_read_back` with fresh Messages decoded, as it were, from what was
stored. Beyond the model's checks (order per group, nothing lost or duplicated, counts, owners, no
deliverable message left waiting but the cold ones), after every step: the budget's counters are the
warm part's, and after a tick a cold tail with room in the budget has asked for its next records.
Then examples for what the machine does not reach: starvation past the budget, browsers, recovery,
refused management, a queue purge, records the journal lacks.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import precondition, rule

import pytest
from model import _cold_seqs
from node.admin.queue_purge import purge_batch
from node.core.dispatch.broker import Broker
from node.core.dispatch.cold import GROUP_RECORD_BYTES, MESSAGE_RECORD_BYTES, PROMOTE_BATCH_RECORDS
from node.core.effects import Deliver, Dropped, ReadRecords, Removed, Stored
from node.core.errors import ResourceLimitExceeded
from node.core.dispatch.message import COLD, JOURNALLED, Message, Outcome
from node.core.dispatch.reroute import Reroute
from node.core.dispatch.settings import QueueSettings
from test_dispatch_model import DispatchMachine

EXPLORE = os.environ.get("GROUPER_MODEL_EXPLORE") == "1"
RECORD_BUDGET_BYTES = 2 * MESSAGE_RECORD_BYTES + 2 * GROUP_RECORD_BYTES  # two messages of groups of their own
READ_BACK_MAX_BYTES = 7  # a read of cold records stops at the third body of ~3 bytes


def fresh(message: Message) -> Message:
    """The record as the journal decodes it: a new Message with what its STORE held."""
    return Message(message.payload, message.group_id, expires_at_ms=message.expires_at_ms,
                   closes_group=message.closes_group, delivery_count=message.delivery_count,
                   enqueued_at_ms=message.enqueued_at_ms, seq=message.seq)


def next_records(disk: dict, read: ReadRecords) -> dict:
    """What the journal answers a ReadRecords with: the next live records of the queue after its seq, up to
    the one whose body brings the bodies read to its max_bytes (Journal._read_after)."""
    records, body_bytes = {}, 0
    for seq in sorted(seq for queue, seq in disk if queue == read.queue and seq > read.after_seq)[:read.count]:
        if body_bytes >= read.max_bytes:
            break
        records[seq] = fresh(disk[(read.queue, seq)])
        body_bytes += records[seq].size_bytes
    return records


class ColdMachine(DispatchMachine):
    def __init__(self):
        super().__init__()
        self.broker.records.max_bytes = RECORD_BUDGET_BYTES
        self.broker.records.read_max_bytes = READ_BACK_MAX_BYTES  # reads cut short, never taken for lost records
        self.unjournalled: list[tuple[str, Message]] = []  # Stored, not reported on disk yet
        self.disk: dict[tuple[str, int], Message] = {}  # (queue, seq) -> the record as stored
        self.reads: list[ReadRecords] = []  # not answered yet

    def step(self, call, tell_model, *, dispatches: bool = True, ticked: bool = False) -> None:
        def journal_call():
            effects = call()
            for effect in effects:
                if type(effect) is Stored:  # written at once, reported on disk by a later step
                    self.unjournalled.append((effect.queue, effect.message))
                    self.disk[(effect.queue, effect.message.seq)] = fresh(effect.message)
                elif type(effect) is Removed:
                    self.disk.pop((effect.queue, effect.seq), None)
                elif type(effect) is ReadRecords:
                    assert not any(read.queue == effect.queue for read in self.reads), "two reads at once"
                    self.reads.append(effect)
            return effects
        super().step(journal_call, tell_model, dispatches=dispatches, ticked=ticked)
        self.check_budget(ticked)

    def check_budget(self, ticked: bool) -> None:
        """The budget counts the warm part; after a tick (room another queue made is seen then, and the
        node ticks every 100 ms), a cold tail with room for its next records has asked for them."""
        warm_messages = warm_groups = 0
        for queue in self.broker.queues.values():
            if queue.cold is None:
                continue
            warm_messages += queue.depth_messages - queue.cold.count
            warm_groups += len(queue.groups)
            cold = queue.cold
            left = cold.stored
            if ticked and left and not cold.asked:
                assert self.broker.records.room_records() < min(left, PROMOTE_BATCH_RECORDS), \
                    f"{queue.settings.name}: {left} cold records, room in the budget, and nothing asked"
        assert self.broker.records.messages == warm_messages, (self.broker.records.messages, warm_messages)
        assert self.broker.records.groups == warm_groups, (self.broker.records.groups, warm_groups)

    @precondition(lambda self: self.unjournalled)
    @rule()
    def journal_written(self):
        stores, self.unjournalled = self.unjournalled, []
        self.step(lambda: self.broker.journalled(stores, self.now_ms), lambda: None)

    @precondition(lambda self: self.reads)
    @rule()
    def records_read_back(self):
        read = self.reads.pop(0)
        records = next_records(self.disk, read)
        whole = next_records(self.disk, ReadRecords(read.queue, read.after_seq, read.count, 1 << 30))
        assert len(whole) == read.count, f"{read} asks for more records than the journal has after its seq"
        self.step(lambda: self.broker.promote(read.queue, records, self.now_ms), lambda: None)

    @precondition(lambda self: len(self.sent) > len(self.batch_failed))
    @rule(count=st.integers(1, 4))
    def journal_batch_fails(self, count):
        """The batch of the latest sends not on disk yet fails (those on disk were in earlier batches)."""
        waiting = {message.seq for _, message in self.unjournalled}
        seqs = [seq for seq in self.sent if seq not in self.batch_failed and seq in waiting][-count:]
        if not seqs:
            return
        self.unjournalled = [(q, m) for q, m in self.unjournalled if m.seq not in seqs]
        for seq in seqs:  # the failed batch is cut off the file
            self.disk.pop(("q", seq), None)
        self.take_back(seqs)


def machine_for(name: str, examples: int, **queue_settings):
    machine = type(name, (ColdMachine,), {
        "queue_settings": QueueSettings(name="q", **queue_settings).validate()})
    test_case = machine.TestCase
    test_case.settings = settings(
        max_examples=examples, stateful_step_count=50, deadline=None, database=None,
        derandomize=not EXPLORE, suppress_health_check=[HealthCheck.too_slow])
    return test_case


TestColdExclusive = machine_for("ColdExclusive", 150, group_policy="exclusive", dead_letter_queue="dlq")
TestColdShared = machine_for("ColdShared", 150, group_policy="shared", delivery_count_max=2, dead_letter_queue="dlq")
TestColdBucketsAndDefaultGroup = machine_for(
    "ColdBucketsAndDefaultGroup", 80, group_policy="exclusive", group_buckets=3, default_group="dg")
TestColdRedeliveryDelay = machine_for(
    "ColdRedeliveryDelay", 80, group_policy="shared", delivery_count_max=3, redelivery_delay_ms=5)


# ---- examples ---------------------------------------------------------------------------------

class Node:
    """A broker whose journal answers at once: every STORE on disk, every read answered, until quiet."""

    def __init__(self, messages: int, groups: int, **settings):
        """A record budget of exactly `messages` warm messages in `groups` groups."""
        self.broker = Broker()
        self.broker.records.max_bytes = messages * MESSAGE_RECORD_BYTES + groups * GROUP_RECORD_BYTES
        self.queue = self.broker.declare_queue(QueueSettings(name="q", **settings))
        self.disk: dict[tuple[str, int], Message] = {}
        self.delivered: list[tuple[str, bytes]] = []
        self.reads = 0
        self.now_ms = 0

    def run(self, effects: list, answer_reads: bool = True) -> list:
        """Carry effects out like the node would; returns every effect seen."""
        seen = []
        while effects:
            seen += effects
            stores = [(e.queue, e.message) for e in effects if type(e) is Stored]
            reads = [e for e in effects if type(e) is ReadRecords]
            for e in effects:
                if type(e) is Deliver:
                    self.delivered.append((e.consumer_id, e.message.payload))
                elif type(e) is Removed:
                    self.disk.pop((e.queue, e.seq), None)
            for queue_name, message in stores:
                self.disk[(queue_name, message.seq)] = fresh(message)
            effects = self.broker.journalled(stores, self.now_ms) if stores else []
            if answer_reads:
                for read in reads:
                    self.reads += 1
                    effects += self.broker.promote(read.queue, next_records(self.disk, read), self.now_ms)
        return seen

    def send(self, group, count: int = 1) -> None:
        for _ in range(count):
            seq = self.broker.next_seq
            self.run(self.broker.enqueue("q", Message(b"%s-%d" % (str(group).encode(), seq), group), self.now_ms))

    def consumer(self, cid: str, credit: int, browse: bool = False) -> None:
        self.run(self.broker.attach_consumer("q", cid, browse, self.now_ms))
        self.run(self.broker.set_credit(cid, credit, self.now_ms))

    def accept_all(self, cid: str) -> None:
        consumer = self.queue.consumers[cid]
        for delivery_id in list(consumer.unsettled):
            self.run(self.broker.settle(cid, delivery_id, Outcome.ACCEPTED, self.now_ms))


def test_past_the_budget_arrivals_go_cold_and_keep_only_their_seqs_once_on_disk():
    node = Node(2, 1)
    node.send("a", 5)
    cold = node.queue.cold
    assert cold.count == cold.stored == 3 and not cold.pending and cold.after_seq == 2
    assert node.queue.stats()["depth_messages"] == 5
    assert node.queue.stats()["cold_messages"] == 3
    assert node.queue.stats()["resident_bytes"] == 2 * len(b"a-1")  # the two warm bodies
    assert [m.seq for m in node.queue._store.log] == [1, 2]


def test_an_arrival_waits_whole_until_its_store_is_on_disk_and_a_failed_write_withdraws_it():
    broker = Broker()
    broker.records.max_bytes = 1  # one warm message fills it
    queue = broker.declare_queue(QueueSettings(name="q"))
    broker.enqueue("q", Message(b"w", "a"), 0)
    message = Message(b"x", "a")
    effects = broker.enqueue("q", message, 0)
    assert message.flags & COLD and queue.cold.pending[0] is message
    handed_out, effects = broker.take_back([("q", message)], 0)
    assert handed_out == [False]
    assert queue.depth_messages == 1 and queue.cold.count == 0 and not message.flags & COLD


def test_cold_messages_come_back_in_order_as_consumers_drain_the_warm_part():
    node = Node(3, 3)
    for group in "abcab":
        node.send(group, 3)
    node.consumer("c1", 100)
    while node.queue.depth_messages:
        node.accept_all("c1")
    by_group: dict = {}
    for _, payload in node.delivered:
        group, seq = payload.split(b"-")
        by_group.setdefault(group, []).append(int(seq))
    assert sorted(sum(by_group.values(), [])) == list(range(1, 16))
    assert all(seqs == sorted(seqs) for seqs in by_group.values()), by_group
    # exclusive owners keep their empty groups (and so their budget share)
    assert node.broker.records.messages == 0 and node.broker.records.groups == len(node.queue.groups) == 3
    assert node.queue.cold.count == 0 and node.queue.cold.journal_bytes == 0


def test_a_starved_consumer_reads_past_the_budget_while_a_slow_one_holds_the_warm_part():
    node = Node(2, 1, group_policy="exclusive")
    node.consumer("slow", 1)
    node.send("a", 3)  # a1 to slow (no more credit); a2 warm; a3 cold
    node.send("b", 2)  # cold
    node.consumer("fast", 10)
    assert [(c, p) for c, p in node.delivered if c == "fast"] == [("fast", b"b-4"), ("fast", b"b-5")]
    assert node.queue.cold.count == 0  # a3 came back with them, and waits for slow
    assert node.broker.records.used_bytes > node.broker.records.max_bytes  # past the budget, on purpose


def test_nobody_starves_while_a_read_of_bodies_is_on_its_way():
    node = Node(1, 1)
    node.send("a", 2)
    queue = node.queue
    queue.pager.requested_bytes = 1  # a body is on its way back
    effects: list = []
    queue.attach("c", False, 0, effects)
    queue.set_credit("c", 5, 0, effects)
    queue.pager.requested_bytes = 0
    assert not any(type(e) is ReadRecords for e in effects[1:])  # the first delivery only, no read


def test_a_browser_at_the_end_of_the_warm_part_reads_the_cold_tail():
    node = Node(1, 1)
    node.send("a", 4)
    node.consumer("v", 10, browse=True)
    assert [p for _, p in node.delivered] == [b"a-1", b"a-2", b"a-3", b"a-4"]
    assert node.queue.depth_messages == 4


def test_a_recovered_backlog_starts_cold_and_fills_the_budget_at_the_first_dispatch():
    broker = Broker()
    broker.records.max_bytes = 3 * (MESSAGE_RECORD_BYTES + GROUP_RECORD_BYTES)
    queue = broker.declare_queue(QueueSettings(name="q"))
    disk = {seq: Message(b"m%d" % seq, "g%d" % (seq % 2), seq=seq) for seq in range(10, 20)}
    broker.restore_cold("q", [seq for seq in disk], sum(m.size_bytes for m in disk.values()))
    assert broker.next_seq == 20 and queue.depth_messages == 10 and queue.cold.count == 10
    effects = broker.tick(0)
    reads = [e for e in effects if type(e) is ReadRecords]
    assert [(r.after_seq, r.count) for r in reads] == [(9, 3)]
    broker.promote("q", next_records({("q", seq): m for seq, m in disk.items()}, reads[0]), 0)
    assert [m.seq for m in queue._store.log] == [10, 11, 12] and queue.cold.count == 7 and queue.cold.after_seq == 12
    assert queue.depth_bytes == sum(m.size_bytes for m in disk.values())


def test_a_record_the_journal_lacks_is_dropped_loudly_and_its_bytes_leave_the_depth():
    node = Node(1, 1)
    node.send("a", 3)
    node.consumer("c", 0)
    effects = node.broker.set_credit("c", 10, 0)  # starved: asks for the two after a-1
    read = next(e for e in effects if type(e) is ReadRecords)
    assert (read.after_seq, read.count) == (1, 2)
    effects = node.broker.promote("q", {2: fresh(node.disk[("q", 2)])}, 0)  # a-3's record is gone
    assert [e.reason for e in effects if type(e) is Dropped] == ["1 cold records after this seq are missing from "
                                                                 "the journal"]
    assert node.queue.depth_messages == 2 and node.queue.depth_bytes == 2 * len(b"a-1")
    assert node.queue.cold.count == 0


def test_a_read_cut_short_by_its_byte_bound_loses_nothing_and_the_next_read_goes_on():
    node = Node(1, 1)
    node.broker.records.read_max_bytes = 2 * len(b"a-1")
    node.send("a", 6)
    node.consumer("c", 0)
    effects = node.broker.set_credit("c", 10, 0)  # starved: asks for the five after a-1
    read = next(e for e in effects if type(e) is ReadRecords)
    assert (read.after_seq, read.count, read.max_bytes) == (1, 5, 6)
    effects = node.broker.promote("q", next_records(node.disk, read), 0)
    assert not [e for e in effects if type(e) is Dropped]  # two of five came back: the bound, not a loss
    assert node.queue.depth_messages == 6 and node.queue.cold.count == 3 and node.queue.cold.after_seq == 3
    read = next(e for e in effects if type(e) is ReadRecords)
    assert (read.after_seq, read.count) == (3, 3)
    node.broker.promote("q", {4: fresh(node.disk[("q", 4)])}, 0)  # short of the bound: 5 and 6 are missing
    assert node.queue.depth_messages == 4 and node.queue.cold.count == 0


def test_an_answer_for_a_read_the_queue_did_not_ask_is_ignored():
    node = Node(1, 1)
    node.send("a", 2)
    assert node.queue.cold.count == 1
    assert node.broker.promote("q", {99: Message(b"z", "a", seq=99)}, 0) == []
    node.send("a", 1)
    assert node.queue.cold.count == 2 and node.queue.cold.after_seq == 1
    node.queue.cold.asked = 1  # a read is out: an answer below after_seq, or larger than asked, is not its answer
    stale = {1: Message(b"a-1", "a", seq=1)}
    assert node.broker.promote("q", stale, 0) == [] and node.queue.cold.count == 2 and node.queue.depth_messages == 3
    stale = {2: Message(b"a-2", "a", seq=2), 3: Message(b"a-3", "a", seq=3)}
    assert node.broker.promote("q", stale, 0) == [] and node.queue.cold.count == 2 and node.queue.cold.asked == 1


def test_group_purge_move_and_reroute_are_refused_while_a_cold_tail_is_there():
    node = Node(1, 1)
    node.broker.declare_queue(QueueSettings(name="other"))
    node.send("a", 3)
    with pytest.raises(ResourceLimitExceeded, match="record_memory_max_bytes"):
        node.broker.purge_group("q", "a", None, 0)
    with pytest.raises(ResourceLimitExceeded, match="moving group 'a'"):
        node.broker.move_group("q", "a", "other", None, 0)
    with pytest.raises(ResourceLimitExceeded, match="rerouting"):
        Reroute("q", "other").batch(node.broker, 0)
    assert node.queue.depth_messages == 3


def test_a_queue_purge_reads_the_cold_tail_back_and_purges_it_all():
    node = Node(2, 2)
    for group in "abcdef":
        node.send(group, 2)
    assert node.queue.cold.count == 9  # a1, a2 and b3 fill the budget
    purged_total, position, done, turns = 0, 0, False, 0
    while not done:
        effects: list = []
        purged, position, done = purge_batch(node.queue, position, 0, effects)
        purged_total += purged
        node.run(effects)
        turns += 1
    assert purged_total == 12 and node.queue.depth_messages == 0 and node.queue.depth_bytes == 0
    assert node.disk == {} and node.broker.records.messages == 0 and node.broker.records.groups == 0


def test_a_deleted_queue_gives_its_warm_records_back_to_the_budget():
    node = Node(2, 1)
    node.send("a", 2)
    node.send("b", 3)
    assert node.broker.records.messages == 2 and node.queue.cold.count == 3
    node.broker.delete_queue("q")
    assert node.broker.records.messages == 0 and node.broker.records.groups == 0


def test_the_model_helper_sees_pending_and_journalled_cold_seqs():
    broker = Broker()
    broker.records.max_bytes = 1
    queue = broker.declare_queue(QueueSettings(name="q"))
    effects = [e for text in (b"w", b"x", b"y") for e in broker.enqueue("q", Message(text, "a"), 0)]
    stores = [(e.queue, e.message) for e in effects if type(e) is Stored]
    broker.journalled(stores[:2], 0)
    assert stores[1][1].flags & JOURNALLED
    assert _cold_seqs(queue, [1, 2, 3]) == {2, 3} and queue.cold.stored == 1 and len(queue.cold.pending) == 1


def test_a_failed_batch_in_the_middle_of_pending_arrivals_leaves_the_others_to_go_on():
    broker = Broker()
    broker.records.max_bytes = 1  # one warm message fills it
    queue = broker.declare_queue(QueueSettings(name="q"))
    effects = [e for text in (b"w", b"a", b"b", b"c", b"d") for e in broker.enqueue("q", Message(text, "g"), 0)]
    stores = [(e.queue, e.message) for e in effects if type(e) is Stored]
    failed = [stores[2], stores[3]]  # b and c: their batch was not written
    handed_out, _ = broker.take_back(failed, 0)
    assert handed_out == [False, False] and queue.cold.count == 2 and queue.depth_messages == 3
    broker.journalled([stores[0], stores[1], stores[4]], 0)  # w, a and d are on disk
    assert queue.cold.stored == 2 and queue.cold.pending_count == 0 and not queue.cold.pending
    assert queue.cold.journal_bytes == 2 and queue.depth_bytes == 3
