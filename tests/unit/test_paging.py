"""Paging message bodies to the journal (node/core/dispatch/paging.py), driven through a real Queue.

The journal is a dict here: a body is "on disk" once the test journals its STORE, and a PageIn is
answered from the dict, in any order and any time later. Checked against a reference of each group's
(and the ungrouped lane's) available seqs, with purges of whole groups among the steps: every delivery
is its group's lowest available seq and carries the body that was sent; nothing is lost; no body is asked for twice; after page-out the pageable bytes fit the budget; bodies
asked for or read back stay within the read-ahead bound (plus one message, plus released ones).
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from node.core.dispatch.broker import Broker
from node.core.effects import Deliver, Dropped, PageIn, Stored
from node.core.dispatch.message import ACQUIRED, AVAILABLE, FETCHED, JOURNALLED, PAGED, STATE_MASK, Message, Outcome
from node.core.dispatch.queue import Queue
from node.core.dispatch.settings import QueueSettings

BUDGET_BYTES = 400
READ_AHEAD_BYTES = 300
SIZE_MAX_BYTES = 60
GROUPS = ("a", "b", "c", None)  # None: messages in no group, delivered in queue order


def body(seq: int, size: int) -> bytes:
    return (b"%d:" % seq).ljust(size, b"x")


class PagingMachine(RuleBasedStateMachine):
    @initialize()
    def start(self):
        self.queue = Queue(QueueSettings(name="q", memory_max_bytes=BUDGET_BYTES, delivery_count_max=0))
        self.queue.pager.read_ahead_bytes_max = READ_AHEAD_BYTES
        self.now_ms = 0
        self.next_seq = 1
        self.disk: dict[int, bytes] = {}  # seq -> body of every journalled STORE
        self.sent: dict[int, bytes] = {}  # seq -> body, of every message still in the queue
        self.unjournalled: list[Message] = []
        self.available: dict[str, set[int]] = {group: set() for group in GROUPS}
        self.unsettled: dict[str, list[tuple[int, Message]]] = {}
        self.asked: list[int] = []  # PageIn seqs not answered yet
        self.asked_ever: set[int] = set()
        self.returned: set[int] = set()  # released and not delivered again: FETCHED beyond read-ahead
        self.accepted = 0

    def carry_out(self, effects: list) -> None:
        for effect in effects:
            if type(effect) is Stored:
                self.unjournalled.append(effect.message)
                assert effect.message.payload is not None
            elif type(effect) is PageIn:
                for seq in effect.seqs:
                    assert seq not in self.asked_ever, f"body of {seq} asked for twice"
                    self.asked_ever.add(seq)
                    self.asked.append(seq)
            elif type(effect) is Deliver:
                message = effect.message
                group = message.group_id
                assert message.seq == min(self.available[group]), (message, sorted(self.available[group]))
                assert message.payload == self.sent[message.seq], message
                self.available[group].discard(message.seq)
                self.returned.discard(message.seq)
                self.unsettled[effect.consumer_id].append((effect.delivery_id, message))

    @rule(group=st.sampled_from(GROUPS), size=st.integers(1, SIZE_MAX_BYTES))
    def send(self, group, size):
        seq = self.next_seq
        self.next_seq += 1
        payload = body(seq, size)
        self.sent[seq] = payload
        self.available[group].add(seq)
        effects: list = []
        self.queue.enqueue(Message(payload, group, seq=seq), self.now_ms, effects)
        self.carry_out(effects)

    @rule()
    def journal(self):
        """The writer reports the pending STOREs on disk; the broker marks them and pages out."""
        for message in self.unjournalled:
            self.disk[message.seq] = message.payload
            message.flags |= JOURNALLED
        self.unjournalled.clear()
        self.queue.page_out(BUDGET_BYTES)
        assert self.queue.pager.pageable_bytes <= BUDGET_BYTES

    @rule(data=st.data())
    @precondition(lambda self: self.asked)
    def read_back(self, data):
        """The writer answers some of the asked-for bodies, in any order."""
        count = data.draw(st.integers(1, len(self.asked)))
        picked = data.draw(st.permutations(self.asked))[:count]
        for seq in picked:
            self.asked.remove(seq)
        effects: list = []
        self.queue.page_in({seq: self.disk[seq] for seq in picked}, self.now_ms, effects)
        self.carry_out(effects)

    @rule(group=st.sampled_from(GROUPS[:-1]))
    def purge(self, group):
        """An admin purge takes a group's available messages, paged ones included."""
        if group not in self.queue.groups:
            return
        effects: list = []
        taken = self.queue.take_group_messages(group, None, effects, bodies=False)
        assert sorted(m.seq for m in taken) == sorted(self.available[group])
        for message in taken:
            del self.sent[message.seq]
            self.returned.discard(message.seq)
        self.available[group].clear()
        self.carry_out(effects)

    @rule(consumer=st.sampled_from(("c1", "c2")), credit=st.integers(0, 6))
    def grant(self, consumer, credit):
        effects: list = []
        if consumer not in self.unsettled:
            self.unsettled[consumer] = []
            self.queue.attach(consumer, False, self.now_ms, effects)
        self.queue.set_credit(consumer, credit, self.now_ms, effects)
        self.carry_out(effects)

    @rule(consumer=st.sampled_from(("c1", "c2")), accept=st.booleans())
    def settle(self, consumer, accept):
        held = self.unsettled.get(consumer)
        if not held:
            return
        delivery_id, message = held.pop(0)
        if accept:
            self.accepted += 1
            del self.sent[message.seq]
        else:
            self.available[message.group_id].add(message.seq)
            self.returned.add(message.seq)
        effects: list = []
        self.queue.settle(consumer, delivery_id, Outcome.ACCEPTED if accept else Outcome.RELEASED, False,
                          self.now_ms, effects)
        self.carry_out(effects)

    @invariant()
    def bookkeeping_matches_the_messages(self):
        if not hasattr(self, "queue"):
            return
        pager = self.queue.pager
        live = [m for m in self.queue.browse_available() if m.flags & STATE_MASK == AVAILABLE]
        assert pager.paged_bytes == sum(m.size_bytes for m in live if m.flags & PAGED)
        assert pager.fetched_bytes == sum(m.size_bytes for m in live if m.flags & FETCHED)
        assert pager.pageable_bytes == sum(m.size_bytes for m in live if not m.flags & (PAGED | FETCHED))
        assert all((m.payload is None) == bool(m.flags & PAGED) for m in live)
        assert all(m.payload is not None for m in self.queue.browse_available() if m.flags & STATE_MASK == ACQUIRED)
        returned_bytes = sum(len(self.sent[seq]) for seq in self.returned)
        assert pager.fetched_bytes + pager.requested_bytes - returned_bytes < READ_AHEAD_BYTES + SIZE_MAX_BYTES

    def teardown(self):
        if not hasattr(self, "queue"):
            return
        # drain: everything sent and not accepted comes out, in group order, with its body
        for _ in range(10_000):
            self.journal()
            if self.asked:
                effects: list = []
                asked, self.asked = self.asked, []
                self.queue.page_in({seq: self.disk[seq] for seq in asked}, self.now_ms, effects)
                self.carry_out(effects)
            for consumer in list(self.unsettled):
                while self.unsettled[consumer]:
                    self.settle(consumer, True)
                self.grant(consumer, 5)
            if not self.unsettled:
                self.grant("c1", 5)
            if not self.sent:
                break
        assert not self.sent, f"never delivered: {sorted(self.sent)}"
        assert self.queue.depth_messages == 0


PagingMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None,
                                           suppress_health_check=[HealthCheck.too_slow])
TestPagingAgainstReference = PagingMachine.TestCase


def test_a_group_whose_head_is_paged_waits_while_other_groups_go_on():
    queue = Queue(QueueSettings(name="q", memory_max_bytes=10))
    effects: list = []
    for seq, group in ((1, "a"), (2, "b"), (3, "a")):
        queue.enqueue(Message(b"x" * 10, group, seq=seq), 0, effects)
    for message in queue.browse_available():
        message.flags |= JOURNALLED
    queue.page_out(10)  # the newest first: 3 then 2; 1 stays
    assert [m.seq for m in queue.browse_available() if m.flags & PAGED] == [2, 3]
    effects = []
    queue.attach("c", False, 0, effects)
    queue.set_credit("c", 10, 0, effects)
    delivered = [e.message.seq for e in effects if type(e) is Deliver]
    asked = [seq for e in effects if type(e) is PageIn for seq in e.seqs]
    assert delivered == [1]
    assert sorted(asked) == [2, 3]
    effects = []
    queue.page_in({3: b"y" * 10}, 0, effects)  # a's next, before b's: a goes on, b still waits
    assert [e.message.seq for e in effects if type(e) is Deliver] == [3]
    effects = []
    queue.page_in({2: b"z" * 10}, 0, effects)
    assert [(e.message.seq, e.message.payload) for e in effects if type(e) is Deliver] == [(2, b"z" * 10)]


def test_an_unjournalled_body_is_never_paged_out():
    queue = Queue(QueueSettings(name="q", memory_max_bytes=1))
    effects: list = []
    queue.enqueue(Message(b"x" * 10, "a", seq=1), 0, effects)
    assert queue.page_out(1) == 0
    assert queue.browse_available()[0].payload == b"x" * 10


def test_the_node_budget_pages_the_queue_holding_most_first():
    broker = Broker()
    broker.memory_max_bytes = 100
    for name in ("big", "small"):
        broker.declare_queue(QueueSettings(name=name))
    stores = []
    for count, name in ((15, "big"), (5, "small")):
        for _ in range(count):
            effects = broker.enqueue(name, Message(b"x" * 10, "g"), 0)
            stores += [(e.queue, e.message) for e in effects if type(e) is Stored]
    broker.journalled(stores, 0)
    assert broker.queues["big"].pager.pageable_bytes + broker.queues["small"].pager.pageable_bytes == 100
    assert broker.queues["small"].pager.paged_bytes == 0
    assert broker.queues["big"].stats()["paged_bytes"] == 100


def test_a_non_durable_queue_has_no_pager_and_refuses_a_budget():
    import pytest

    from node.core.errors import InvalidConfig
    assert Queue(QueueSettings(name="q", durable=False)).pager is None
    with pytest.raises(InvalidConfig, match="memory_max_bytes"):
        QueueSettings(name="q", durable=False, memory_max_bytes=1).validate()


def test_a_group_held_for_a_hand_over_keeps_its_bodies_and_asks_back_those_paged_before():
    queue = Queue(QueueSettings(name="q", memory_max_bytes=10))
    effects: list = []
    for seq, group in ((1, "a"), (2, "a"), (3, "b"), (4, "b")):
        queue.enqueue(Message(b"x" * 10, group, seq=seq), 0, effects)
    for message in queue.browse_available():
        message.flags |= JOURNALLED
    queue.page_out(30)  # 4 goes
    queue.hold_group("b")
    queue.hold_group("a")
    queue.page_out(0)  # held: nothing more goes
    assert [m.seq for m in queue.browse_available() if m.flags & PAGED] == [4]
    taken, whole = queue.hand_over_group("b", [], 10, 1 << 20)  # what is in memory goes; 4 is asked for
    assert [m.seq for m in taken] == [3] and not whole
    effects = []
    queue.tick(0, effects)
    assert [seq for e in effects if type(e) is PageIn for seq in e.seqs] == [4]
    queue.page_in({4: b"y" * 10}, 0, effects)
    taken, whole = queue.hand_over_group("b", [], 10, 1 << 20)
    assert [m.seq for m in taken] == [4] and whole and "b" not in queue.groups


def test_a_held_group_goes_a_window_at_a_time_within_the_read_ahead_bytes_and_is_never_stalled_by_other_groups():
    # read back whole before its hand-over, a large group was in memory twice over; now a window of its
    # bodies comes back at a time (past READ_AHEAD_MESSAGES, within the read-ahead bytes), and when other
    # groups' read-ahead fills the room it still gets one body a round, so a move cannot stall for good
    queue = paged_queue(*["a"] * 4, *["b"] * 40, budget_bytes=0)
    queue.pager.read_ahead_bytes_max = 40
    effects: list = []
    queue.attach("c", False, 0, effects)
    queue.set_credit("c", 0, 0, effects)
    queue.pager.want(queue.groups["a"])  # a consumer's group read ahead: all 40 bytes of the room, never taken
    queue.tick(0, effects)
    queue.page_in({seq: b"%02d" % seq * 5 for e in effects if type(e) is PageIn for seq in e.seqs}, 0, [])
    assert queue.pager.fetched_bytes == 40
    queue.hold_group("b")
    taken, whole = queue.hand_over_group("b", [], 100, 1 << 20)
    assert taken == [] and not whole
    handed = []
    for _ in range(40):
        effects = []
        queue.tick(0, effects)
        asked = [seq for e in effects if type(e) is PageIn for seq in e.seqs]
        assert len(asked) <= 1  # the room is full: one body a round
        queue.page_in({seq: b"%02d" % seq * 5 for seq in asked}, 0, [])
        taken, whole = queue.hand_over_group("b", [], 100, 1 << 20)
        handed += [m.seq for m in taken]
        if whole:
            break
    assert handed == list(range(5, 45)) and whole
    assert queue.pager.fetched_bytes == 40  # a's read-ahead stayed as it was


def test_a_held_group_with_room_reads_back_a_window_past_the_per_group_message_count():
    from node.core.dispatch.paging import READ_AHEAD_MESSAGES

    count = 3 * READ_AHEAD_MESSAGES
    queue = paged_queue(*["b"] * count, budget_bytes=0)
    queue.pager.read_ahead_bytes_max = 10 * (2 * READ_AHEAD_MESSAGES)  # room for two groups' windows
    queue.hold_group("b")
    assert queue.hand_over_group("b", [], count, 1 << 20) == ([], False)
    effects: list = []
    queue.tick(0, effects)
    asked = [seq for e in effects if type(e) is PageIn for seq in e.seqs]
    assert asked == list(range(1, 2 * READ_AHEAD_MESSAGES + 1))
    queue.page_in({seq: b"%02d" % seq * 5 for seq in asked}, 0, [])
    taken, whole = queue.hand_over_group("b", [], 10, 25)  # and the hand-over's own bounds: 3 bodies reach 25
    assert [m.seq for m in taken] == [1, 2, 3] and not whole


def paged_queue(*groups, budget_bytes: int = 10, **settings) -> Queue:
    """A queue holding one 10-byte message per entry of `groups` (seq 1, 2, ...), all journalled and
    paged down to `budget_bytes`."""
    queue = Queue(QueueSettings(name="q", memory_max_bytes=budget_bytes, **settings))
    for seq, group in enumerate(groups, start=1):
        queue.enqueue(Message(b"%02d" % seq * 5, group, seq=seq), 0, [])
    for message in queue.browse_available():
        message.flags |= JOURNALLED
    queue.page_out(budget_bytes)
    return queue


def test_messages_in_no_group_wait_for_their_bodies_in_queue_order():
    queue = paged_queue(None, None, None)  # an exclusive queue without default group: ungrouped
    effects: list = []
    queue.attach("c", False, 0, effects)
    queue.set_credit("c", 10, 0, effects)
    assert [e.message.seq for e in effects if type(e) is Deliver] == [1]
    assert [seq for e in effects if type(e) is PageIn for seq in e.seqs] == [2, 3]
    effects = []
    queue.page_in({3: b"03" * 5}, 0, effects)  # the later one first: nothing overtakes seq 2
    assert not [e for e in effects if type(e) is Deliver]
    queue.page_in({2: b"02" * 5}, 0, effects)
    assert [e.message.seq for e in effects if type(e) is Deliver] == [2, 3]


def test_a_browser_waits_at_a_paged_body_and_what_it_read_back_may_be_paged_again():
    queue = paged_queue("a", "a", "a")
    effects: list = []
    queue.attach("b", True, 0, effects)
    queue.set_credit("b", 10, 0, effects)
    assert [e.message.seq for e in effects if type(e) is Deliver] == [1]
    assert [e.seqs for e in effects if type(e) is PageIn] == [(2,)]
    effects = []
    queue.page_in({2: b"02" * 5}, 0, effects)
    assert [e.message.seq for e in effects if type(e) is Deliver] == [2]
    assert [e.seqs for e in effects if type(e) is PageIn] == [(3,)]
    assert queue.pager.fetched_bytes == 0  # a browser's bodies hold no read-ahead room
    assert queue.page_out(10) == 10  # seq 2 goes again; only seq 1 stays


def test_a_body_the_journal_does_not_have_drops_its_message_loudly():
    queue = paged_queue("a", "a")
    effects: list = []
    queue.attach("c", False, 0, effects)
    queue.set_credit("c", 10, 0, effects)
    effects = []
    queue.page_in({2: None}, 0, effects)
    assert [(e.seq, e.reason) for e in effects if type(e) is Dropped] == [(2, "its body is missing from the journal")]
    assert queue.depth_messages == 1 and queue.pager.paged_bytes == 0


def test_a_group_whose_owner_grants_no_credit_reads_nothing_ahead():
    queue = paged_queue("a", "a", "a", budget_bytes=10)  # 2 and 3 paged
    effects: list = []
    queue.attach("c", False, 0, effects)
    queue.set_credit("c", 1, 0, effects)  # takes 1 and owns a; then no credit
    assert [e.message.seq for e in effects if type(e) is Deliver] == [1]
    effects = []
    queue.settle("c", 0, Outcome.ACCEPTED, False, 0, effects)
    queue.tick(0, effects)
    assert not [e for e in effects if type(e) is PageIn]
    assert queue.pager.fetched_bytes + queue.pager.requested_bytes == 0
    queue.set_credit("c", 1, 0, effects)
    assert [e.seqs for e in effects if type(e) is PageIn] == [(2, 3)]


def test_a_move_takes_the_resident_head_of_a_group_and_the_rest_once_its_bodies_are_back():
    broker = Broker()
    source = broker.declare_queue(QueueSettings(name="q", memory_max_bytes=10))
    broker.declare_queue(QueueSettings(name="archive"))
    stores = []
    for _ in range(3):
        stores += [(e.queue, e.message) for e in broker.enqueue("q", Message(b"x" * 10, "a"), 0) if type(e) is Stored]
    broker.journalled(stores, 0)  # 2 and 3 paged
    moved, effects = broker.move_group("q", "a", "archive", None, 0)
    assert moved == 1
    assert [e.seqs for e in effects if type(e) is PageIn] == [(2, 3)]
    assert all(e.message.payload is not None for e in effects if type(e) is Stored)
    source.page_in({2: b"y" * 10, 3: b"z" * 10}, 0, [])
    moved, effects = broker.move_group("q", "a", "archive", None, 0)
    assert moved == 2
    assert [e.message.payload for e in effects if type(e) is Stored] == [b"y" * 10, b"z" * 10]
    assert source.depth_messages == 0 and source.pager.fetched_bytes == 0


def test_a_queue_under_its_budget_keeps_no_message_it_no_longer_has():
    # never over budget, so page-out never runs and never meets the stale entries of the pageable list:
    # the list is swept as it grows, or every message the queue ever had would stay in memory with its body
    from node.core.dispatch.paging import PAGEABLE_SWEEP_MIN

    queue = Queue(QueueSettings(name="q", memory_max_bytes=1 << 30))
    effects: list = []
    queue.attach("c", False, 0, effects)
    queue.set_credit("c", 1 << 30, 0, effects)
    longest = delivered = 0
    for seq in range(1, 20_001):
        effects = []
        queue.enqueue(Message(b"x" * 100, f"g{seq % 10}", seq=seq), 0, effects)
        for effect in [e for e in effects if type(e) is Deliver]:
            queue.settle("c", effect.delivery_id, Outcome.ACCEPTED, False, 0, [])
            delivered += 1
        longest = max(longest, len(queue.pager._pageable))
    assert delivered == 20_000 and queue.pager.pageable_bytes == 0
    assert longest <= 2 * PAGEABLE_SWEEP_MIN


def test_a_few_large_messages_gone_from_a_queue_under_its_budget_are_not_kept_either():
    # the soak's pattern: three 1 MiB bodies an episode, far fewer entries than a sweep by count waits for
    from node.core.dispatch.paging import PAGEABLE_SWEEP_MIN_BYTES

    queue = Queue(QueueSettings(name="q", memory_max_bytes=1 << 30))
    effects: list = []
    queue.attach("c", False, 0, effects)
    queue.set_credit("c", 1 << 30, 0, effects)
    body_bytes = 1 << 20
    for seq in range(1, 201):
        effects = []
        queue.enqueue(Message(b"x" * body_bytes, "L", seq=seq), 0, effects)
        for effect in [e for e in effects if type(e) is Deliver]:
            queue.settle("c", effect.delivery_id, Outcome.ACCEPTED, False, 0, [])
        held_bytes = sum(m.size_bytes for m in queue.pager._pageable if m.payload is not None)
        assert held_bytes <= PAGEABLE_SWEEP_MIN_BYTES + body_bytes, (seq, held_bytes)
