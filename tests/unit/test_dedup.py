"""Producer de-duplication (issue 31, node/core/dispatch/dedup.py): the broker against a reference model,
the shell's answer to a resend, the id reader, and marks that survive a restart through the journal."""

from __future__ import annotations

import argparse
import types

import pytest
from hypothesis import given, settings as hypothesis_settings, strategies as st
from proton import Message as ProtonMessage

from node.admin.queue_flags import add_queue_flags, queue_settings_from_args
from node.amqp import duplicate_ids
from node.amqp.message_fields import dedup_id
from node.core.cluster import MARK_PREFIX, ClusterProtocol
from node.core.cluster.outbound import Entry
from node.core.dispatch.address_settings import AddressSettings
from node.core.dispatch.broker import Broker
from node.core.dispatch.dedup import (DEDUP_ID_LENGTH_MAX_CHARS, DEDUP_PREFIX, Duplicate, Window, decode_marks,
                                     encode_marks)
from node.core.dispatch.message import Message
from node.core.dispatch.settings import QueueSettings
from node.core.durability import Durability
from node.core.effects import AcceptSend, Declared, Refuse, Removed, Reply, Stored
from node.core.errors import InvalidConfig, InvalidField
from node.core.shell import NodeShell
from node.recovery import recover
from node.store.journal import Journal


def text_id(payload: bytes) -> str | None:
    """The test's id reader: the payload itself, b"" for no id."""
    return payload.decode() or None


def dedup_broker(**settings) -> Broker:
    broker = Broker(dedup_id_of=text_id)
    broker.declare_queue(QueueSettings(name="q", dedup=True, **settings))
    broker.declarations()
    return broker


def send(broker: Broker, key: str, now_ms: int) -> list | None:
    """The effects of a send queued, None for a resend dropped."""
    try:
        return broker.enqueue("q", Message(key.encode()), now_ms)
    except Duplicate:
        return None


# ---- the window against a reference model -----------------------------------------------------------

class ReferenceWindow:
    """The naive model: a list of (key, marked_at_ms, seq), oldest first, scanned whole each time."""

    def __init__(self, messages_max: int, window_ms: int):
        self.marks: list[tuple[str, int, int]] = []
        self.messages_max, self.window_ms = messages_max, window_ms

    def send(self, key: str | None, seq: int, now_ms: int) -> bool:
        """Whether it is queued. A send without an id is queued and looks at nothing."""
        if key is None:
            return True
        self.marks = [(k, at, s) for k, at, s in self.marks if not (self.window_ms and at + self.window_ms <= now_ms)]
        if any(k == key for k, _, _ in self.marks):
            return False
        self.marks.append((key, now_ms, seq))
        del self.marks[:-self.messages_max]
        return True

    def forget(self, key: str, seq: int) -> None:
        self.marks = [(k, at, s) for k, at, s in self.marks if (k, s) != (key, seq)]


def journal_apply(journal: dict, effects: list) -> None:
    """A journal of the queue's mark records (seq -> its marks): STOREs and REMOVEs as the node writes them."""
    for effect in effects:
        if type(effect) is Stored and effect.queue == DEDUP_PREFIX + "q":
            assert effect.message.seq not in journal
            journal[effect.message.seq] = list(decode_marks(effect.message.payload))
        elif type(effect) is Removed and effect.queue == DEDUP_PREFIX + "q":
            del journal[effect.seq]  # never a REMOVE of a record not stored


@hypothesis_settings(max_examples=300, deadline=None)
@given(messages_max=st.integers(1, 5), window_ms=st.sampled_from([0, 10, 100]),
       steps=st.lists(st.one_of(st.tuples(st.just("send"), st.sampled_from(["", "a", "b", "c", "d", "e", "f"])),
                                st.tuples(st.just("advance"), st.integers(0, 60)),
                                st.tuples(st.just("batch end"), st.none()),
                                st.tuples(st.just("take back"), st.none())), max_size=60))
def test_a_resend_inside_both_windows_is_dropped_and_outside_them_queued_and_a_restart_remembers_as_much(
        messages_max, window_ms, steps):
    broker = dedup_broker(dedup_window_messages=messages_max, dedup_window_ms=window_ms)
    model = ReferenceWindow(messages_max, window_ms)
    journal: dict = {}
    batch: list = []  # (key, message) queued since the last batch end: a failed write takes them back
    now_ms, dropped, queued_total = 1000, 0, 0
    marked: list = []  # every mark made and not taken back
    taken_back = False
    for kind, value in steps:
        if kind == "advance":
            now_ms += value
        elif kind == "send":
            message = Message(value.encode())
            queued = model.send(value or None, broker.next_seq, now_ms)
            try:
                journal_apply(journal, broker.enqueue("q", message, now_ms))
            except Duplicate as duplicate:
                journal_apply(journal, duplicate.effects)
                assert not queued, (value, now_ms, model.marks)
                dropped += 1
                continue
            assert queued, (value, now_ms, model.marks)
            batch.append((value, message))
            if value:
                marked.append((value, now_ms, message.seq))
            queued_total += 1
        elif kind == "take back" and batch:
            key, message = batch.pop()
            model.forget(key, message.seq)
            marked = [mark for mark in marked if mark[2] != message.seq]
            taken_back = True
            journal_apply(journal, broker.take_back([("q", message)], now_ms)[1])
            queued_total -= 1
        elif kind == "batch end":
            journal_apply(journal, broker.dedup.take_marks())
            batch.clear()
            window = broker.dedup.windows.get("q")
            assert set(journal) == set(window.live if window else ())  # no record outlives its marks
            restarted = dedup_broker(dedup_window_messages=messages_max, dedup_window_ms=window_ms)
            records = [Message(encode_marks(journal[seq]), seq=seq) for seq in sorted(journal)]
            restarted.dedup.restore(restarted.queues["q"].settings, records, now_ms)
            remembered = [(k, at, seq) for k, at, seq in model.marks if not (window_ms and at + window_ms <= now_ms)]
            recovered = live_marks(restarted.dedup.windows["q"])
            if not taken_back:
                assert recovered == remembered
            else:  # room a take-back made may hold, after a restart, marks pushed out before it: never fewer
                assert set(remembered) <= set(recovered) <= set(marked) and len(recovered) <= messages_max
        window = broker.dedup.windows.get("q")
        assert live_marks(window) == model.marks and len(window.marks if window else ()) == len(model.marks)
    assert broker.queues["q"].stats()["depth_messages"] == queued_total
    assert broker.list_queues()[0]["dedup_dropped_total"] == dropped


def live_marks(window) -> list:
    return [(key, at, seq) for key, seq, at, _ in (window.order if window else ()) if window.marks.get(key) == seq]


def test_the_window_is_constant_work_per_message_however_many_marks_it_forgot_early():
    window = Window(messages_max=3, window_ms=0)
    for seq in range(1, 1001):  # each in a record of its own
        window.mark(f"k{seq}", seq, 0, seq)
        assert window.forget(f"k{seq}", seq) == [seq]  # a take-back leaves its deque entry, passed over once
    assert window.expire(0) == [] and len(window.order) == 0 and window.live == {}
    for seq in range(1001, 1005):  # one record
        window.mark(f"m{seq}", seq, 0, 1001)
    assert window.expire(0) == [] and list(window.marks) == ["m1002", "m1003", "m1004"] and window.live == {1001: 3}
    window.messages_max = 0
    assert window.expire(0) == [1001] and window.live == {}  # its last mark gone, the record goes


# ---- the broker and the shell ----------------------------------------------------------------------

def test_a_queue_without_dedup_queues_every_resend_and_journals_no_mark():
    broker = Broker(dedup_id_of=text_id)
    broker.declare_queue(QueueSettings(name="q"))
    effects = broker.enqueue("q", Message(b"a"), 0) + broker.enqueue("q", Message(b"a"), 0)
    assert [e.queue for e in effects if type(e) is Stored] == ["q", "q"] and broker.dedup.windows == {}


def test_a_live_queue_updated_to_dedup_drops_resends_from_then_on_and_takes_a_smaller_window_at_once():
    broker = Broker(dedup_id_of=text_id)
    broker.declare_queue(QueueSettings(name="q"))
    assert send(broker, "a", 0) is not None and send(broker, "a", 0) is not None
    broker.redefine_queue(QueueSettings(name="q", dedup=True))
    assert send(broker, "a", 1) is not None and send(broker, "a", 1) is None and send(broker, "b", 1) is not None
    broker.redefine_queue(QueueSettings(name="q", dedup=True, dedup_window_messages=1))
    assert send(broker, "c", 2) is not None and send(broker, "a", 2) is not None  # "a" and "b" pushed out


def test_a_resend_is_accepted_once_its_batch_is_durable_and_nothing_is_queued_twice():
    broker = dedup_broker()
    shell = NodeShell(broker, Durability(retry_interval_ms=1000), journalled=True)
    first = shell.enqueue_local("p1", "q", Message(b"a"), True, False, 0)
    second = shell.enqueue_local("p2", "q", Message(b"a"), True, False, 1)
    assert [e.queue for e in first] == ["q"] and second == []
    assert not any(type(e) is Refuse for e in first + second)
    marks = shell.end_batch(1)  # the batch's marks, one record, in the unit of its messages
    assert [(type(e), e.queue, e.message.seq) for e in marks] == [(Stored, DEDUP_PREFIX + "q", first[0].message.seq)]
    accepted = shell.batch_ended(7, 1) + shell.durable(7, 2)
    assert [e for e in accepted if type(e) is AcceptSend] == [AcceptSend("p1"), AcceptSend("p2")]
    assert broker.queues["q"].stats()["depth_messages"] == 1


def test_a_send_taken_back_forgets_its_mark_so_the_producers_resend_is_queued():
    broker = dedup_broker()
    first = Message(b"a")
    broker.enqueue("q", first, 0)
    handed_out, effects = broker.take_back([("q", first)], 0)  # its record not taken yet: nothing to remove
    assert handed_out == [False] and mark_records(effects) == [] and broker.dedup.take_marks() == []
    resend = Message(b"a")
    broker.enqueue("q", resend, 1)  # queued: the mark went with the take-back
    [record] = broker.dedup.take_marks()
    assert record.message.seq == resend.seq
    # a failed unit that held the record too: the take-back removes the record with its last mark
    assert mark_records(broker.take_back([("q", resend)], 2)[1]) == [Removed(DEDUP_PREFIX + "q", resend.seq)]
    assert send(broker, "a", 3) is not None


def mark_records(effects: list) -> list:
    return [effect for effect in effects if getattr(effect, "queue", "") == DEDUP_PREFIX + "q"]


def test_a_message_sent_non_durable_is_deduplicated_in_memory_and_its_mark_journalled_no_more_than_it():
    broker = dedup_broker()
    transient = Message(b"t", transient=True)
    assert not mark_records(broker.enqueue("q", transient, 0))  # no STORE for it (issue 29), nor for its mark
    assert send(broker, "t", 1) is None and broker.dedup.take_marks() == []
    durable = Message(b"d")
    broker.enqueue("q", durable, 2)
    [record] = broker.dedup.take_marks()
    assert [key for key, _, _ in decode_marks(record.message.payload)] == ["d"]
    # a take-back of the transient one finds it has no record
    assert mark_records(broker.take_back([("q", transient)], 3)[1]) == [] and send(broker, "t", 3) is not None


def test_an_id_too_long_to_remember_is_refused_naming_the_limit_and_queues_nothing():
    broker = dedup_broker()
    with pytest.raises(InvalidField, match=str(DEDUP_ID_LENGTH_MAX_CHARS)):
        send(broker, "x" * (DEDUP_ID_LENGTH_MAX_CHARS + 1), 0)
    assert broker.queues["q"].stats()["depth_messages"] == 0


def test_the_settings_name_their_limits_and_a_queue_without_dedup_writes_the_record_it_wrote_before():
    assert "dedup" not in QueueSettings(name="q").to_dict()
    assert QueueSettings(name="q", dedup=True).to_dict()["dedup"] is True
    with pytest.raises(InvalidConfig, match="dedup_window_messages"):
        QueueSettings(name="q", dedup=True, dedup_window_messages=0).validate()
    with pytest.raises(InvalidConfig, match="dedup_window_ms"):
        QueueSettings(name="q", dedup_window_ms=-1).validate()


def test_a_cluster_owner_takes_a_forwarded_resend_without_queueing_it_and_acknowledges_it_stored():
    broker = dedup_broker()
    owner = ClusterProtocol("n2", broker, handler_timeout_ms=300, routes_max=10, seq_reserve_block=100)
    owner.ready(0)
    # a producer's resend through another node: a later forward seq, the same id
    entries = [Entry(7, "q", "g", b"a", 0, False, 5), Entry(8, "q", "g", b"a", 0, False, 5)]
    effects = owner.forward_received("n1", entries, "call-1", 10)
    assert [e.queue for e in effects if type(e) is Stored] == ["q"]
    assert [e.queue for e in broker.dedup.take_marks()] == [DEDUP_PREFIX + "q"]  # at the batch's end
    assert [e.values for e in effects if type(e) is Declared] == [{"name": MARK_PREFIX + "n1", "high_water": 8}]
    assert owner.flushed(effects[-1].what, None, 11) == [Reply("call-1", 8, None)]
    assert broker.queues["q"].stats()["depth_messages"] == 1 and broker.list_queues()[0]["dedup_dropped_total"] == 1


# ---- the id reader -------------------------------------------------------------------------------

def test_the_id_is_amq_dupl_id_when_present_else_the_message_id_else_none():
    assert dedup_id(ProtonMessage(id="m1", body="x").encode()) == "m1"
    assert dedup_id(ProtonMessage(id=7, body="x").encode()) == "ID:AMQP_ULONG:7"
    assert dedup_id(ProtonMessage(id="m1", properties={"_AMQ_DUPL_ID": "d1"}).encode()) == "d1"
    assert dedup_id(ProtonMessage(id="m1", properties={"_AMQ_DUPL_ID": b"\x01"}).encode()) == "ID:AMQP_BINARY:01"
    assert dedup_id(ProtonMessage(body="x", properties={"other": 1}).encode()) is None
    assert dedup_id(b"\x00\x53\x73\xc0\xff") is None  # a truncated properties section reads as absent


ids = st.one_of(st.none(), st.text(max_size=20), st.integers(0, 2**64 - 1), st.uuids(), st.binary(max_size=8))


@hypothesis_settings(max_examples=300, deadline=None)
@given(message_id=ids, duplicate_id=st.one_of(st.none(), st.text(max_size=8), st.binary(max_size=4), st.integers(0, 9)),
       others=st.dictionaries(st.text(max_size=6), st.integers(0, 9), max_size=3), durable=st.booleans(),
       annotated=st.booleans(), cut=st.one_of(st.none(), st.integers(0, 200)), flip=st.one_of(st.none(), st.tuples(
           st.integers(0, 200), st.integers(0, 255))))
def test_the_fast_reader_answers_as_the_reference_reader_for_any_message_and_any_damage(
        message_id, duplicate_id, others, durable, annotated, cut, flip):
    properties = dict(others)
    if duplicate_id is not None:
        properties["_AMQ_DUPL_ID"] = duplicate_id
    message = ProtonMessage(id=message_id, body="x", properties=properties or None, durable=durable)
    if annotated:
        message.annotations = {"x-opt-jms-type": "t"}
    payload = bytearray(message.encode())
    if flip is not None and flip[0] < len(payload):
        payload[flip[0]] = flip[1]
    payload = bytes(payload[:cut] if cut is not None else payload)
    assert duplicate_ids.dedup_id(payload) == dedup_id(payload)


# ---- marks survive a restart ----------------------------------------------------------------------

def write(journal: Journal, effects: list) -> None:
    for effect in effects:
        if type(effect) is Stored:
            journal.store(effect.queue, effect.message)
        elif type(effect) is Removed:
            journal.remove(effect.queue, effect.seq)
        elif type(effect) is Declared:
            journal.declare(effect.values)


def restarted_node(directory, now_ms: int, **settings):
    broker = Broker(dedup_id_of=text_id)
    config = types.SimpleNamespace(message_memory_max_bytes=0, queues=[], data_dir=str(directory))
    node = types.SimpleNamespace(broker=broker, journal=Journal(str(directory)), config=config, cluster=None,
                                 clock_ms=lambda: now_ms)
    recover(node)
    return node


def test_marks_survive_a_restart_even_of_messages_consumed_and_age_out_by_their_journalled_time(tmp_path):
    broker = Broker(dedup_id_of=text_id)
    broker.declare_queue(QueueSettings(name="q", dedup=True, dedup_window_ms=1000))
    journal = Journal(str(tmp_path))
    journal.recover()
    journal.start(lambda ticket: None, lambda ticket, error: None)
    write(journal, broker.declarations())
    consumed = Message(b"a")
    write(journal, broker.enqueue("q", consumed, 0) + broker.dedup.take_marks())  # two batches
    write(journal, broker.enqueue("q", Message(b"b"), 500) + broker.dedup.take_marks())
    journal.remove("q", consumed.seq)  # its consumer accepted it: the message is gone, its mark is not
    journal.flush()
    journal.close()

    node = restarted_node(tmp_path, now_ms=900)
    assert node.broker.queues["q"].stats()["depth_messages"] == 1
    assert send(node.broker, "a", 900) is None and send(node.broker, "b", 900) is None
    node.journal.close()

    node = restarted_node(tmp_path, now_ms=1200)  # "a" marked at 0 is past its 1000 ms now, "b" at 500 is not
    assert send(node.broker, "a", 1200) is not None and send(node.broker, "b", 1200) is None
    node.journal.close()


def test_marks_of_a_queue_no_longer_deduplicating_are_deleted_at_recovery(tmp_path):
    journal = Journal(str(tmp_path))
    journal.recover()
    journal.start(lambda ticket: None, lambda ticket, error: None)
    journal.declare(QueueSettings(name="q").to_dict())
    journal.store(DEDUP_PREFIX + "q", Message(b"a", seq=1))
    journal.flush()
    journal.close()
    node = restarted_node(tmp_path, now_ms=0)
    assert node.broker.enqueue("q", Message(b"a"), 0)  # not a dedup queue any more: queued, not a resend
    assert node.broker.dedup.windows == {}
    node.journal.start(lambda ticket: None, lambda ticket, error: None)
    node.journal.flush()
    node.journal.close()
    journal = Journal(str(tmp_path))
    assert DEDUP_PREFIX + "q" not in journal.recover().messages
    journal.close()


# ---- where the setting is given --------------------------------------------------------------------

def test_address_settings_and_queue_flags_give_the_dedup_settings():
    tables = AddressSettings.from_config([{"match": "payments.#", "dedup": True, "dedup-window-ms": 60_000}], {})
    assert (tables.settings_for("payments.eu").dedup, tables.settings_for("payments.eu").dedup_window_ms) == \
        (True, 60_000)
    assert tables.settings_for("orders").dedup is False
    parser = argparse.ArgumentParser()
    add_queue_flags(parser)
    settings = queue_settings_from_args("q", parser.parse_args(["--dedup", "--dedup-window-messages", "5"]))
    assert (settings.dedup, settings.dedup_window_messages, settings.dedup_window_ms) == (True, 5, 300_000)
    with pytest.raises(InvalidConfig, match="--dedup-window-messages"):
        queue_settings_from_args("q", parser.parse_args(["--dedup-window-messages", "0"]))
