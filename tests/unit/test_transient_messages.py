"""Issue 29: a message sent non-durable (its AMQP header says durable false, or has no durable field) on a
durable queue is not journalled: no STORE, no REMOVE, accepted at the end of its batch, never paged, and
gone after a restart; durable ones are journalled as before, and order within a group holds across both.

The cores (queue, pager, shell, owner, the peer wire) are driven as the adapters drive them; one test runs
the shell's journal records through a real journal (node/store) and recovers a fresh broker from it.
"""

from __future__ import annotations

from hypothesis import given, settings as hypothesis_settings, strategies as st
from proton import Message as AmqpMessage

from node.amqp import codec
from node.core.cluster.outbound import Entry, entry_of
from node.core.dispatch.broker import Broker
from node.core.dispatch.message import COLD, JOURNALLED, TRANSIENT, Message, Outcome
from node.core.dispatch.paging import Pager
from node.core.dispatch.settings import QueueSettings
from node.core.durability import Durability
from node.core.effects import (AcceptSend, AcceptWhenStored, AfterFlush, Declared, Deliver, Removed, Stored,
                               SubmitForward)
from node.core.shell import NodeShell
from node.peer.forward_batch import batch_to_pb, entries_from_pb
from node.store.journal import Journal
from proto import peer_pb2
from tests.unit.test_cluster_protocol import protocol, routed
from tests.unit.test_journal import recovered, write_and_close


def shell_with(record_budget_bytes: int = 0) -> NodeShell:
    broker = Broker()
    broker.records.max_bytes = record_budget_bytes
    broker.declare_queue(QueueSettings(name="q", durable=True))
    return NodeShell(broker, Durability(retry_interval_ms=1000), journalled=True)


def send(shell: NodeShell, incoming, body: bytes, durable: bool, group: str = "g") -> list:
    """As node/amqp/incoming.py sends: the send's `durable` is the queue's and the header's together."""
    return shell.enqueue_local(incoming, "q", Message(body, group, transient=not durable), durable, False, 0)


def stored_seqs(effects: list) -> list:
    return [e.message.seq for e in effects if type(e) is Stored]


# ---- the header's durable bit, read on arrival -------------------------------------------------------

def test_the_arrival_reads_the_headers_durable_bit_and_an_absent_header_is_not_durable():
    def arrival(message: AmqpMessage):
        return codec.read_arrival(bytes(message.encode()), "", 0)

    assert arrival(AmqpMessage(body="x", durable=True)).durable is True
    assert arrival(AmqpMessage(body="x", durable=False)).durable is False
    assert arrival(AmqpMessage(body="x")).durable is False  # proton sends no header: AMQP's default, false
    assert arrival(AmqpMessage(body="x", durable=True, ttl=2.0)).expires_at_ms == 2000
    header_list0 = b"\x00\x53\x70\x45" + b"\x00\x53\x77\xa1\x01x"  # a header with no fields at all
    assert codec.read_arrival(header_list0, "", 0).durable is False
    boolean_byte = b"\x00\x53\x70\xc0\x03\x01\x56\x01" + b"\x00\x53\x77\xa1\x01x"  # durable as 0x56 0x01
    assert codec.read_arrival(boolean_byte, "", 0).durable is True


def test_proton_decodes_the_durable_bit_where_the_scanner_cannot_read():
    # what the scanner cannot read goes to proton's decoder (node/amqp/codec.py), which reads the header too
    assert codec._decode_with_proton(bytes(AmqpMessage(body="x", durable=True).encode()), "")[-1] is True
    assert codec._decode_with_proton(bytes(AmqpMessage(body="x").encode()), "")[-1] is False


# ---- the queue: no STORE, no REMOVE, no paging, order across both kinds ------------------------------

def test_a_non_durable_message_writes_no_store_and_no_remove_and_a_durable_one_both():
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q", durable=True))
    effects = broker.enqueue("q", Message(b"d", "g"), 0) + broker.enqueue("q", Message(b"t", "g", transient=True), 0)
    assert [e.message.payload for e in effects if type(e) is Stored] == [b"d"]
    delivered = broker.attach_consumer("q", "c", False, 0) + broker.set_credit("c", 10, 0)
    deliveries = [e for e in delivered if type(e) is Deliver]
    assert [d.message.payload for d in deliveries] == [b"d", b"t"]  # one group: in order across both kinds
    removed = []
    for delivery in deliveries:
        removed += [e for e in broker.settle("c", delivery.delivery_id, Outcome.ACCEPTED, 0) if type(e) is Removed]
    assert [r.seq for r in removed] == [deliveries[0].message.seq]  # no REMOVE for what was never stored


def test_a_non_durable_message_is_never_paged_and_the_durable_ones_around_it_are():
    pager = Pager("q")
    durable = [Message(b"x" * 100, "g", seq=seq) for seq in (1, 3)]
    transient = Message(b"y" * 100, "g", seq=2, transient=True)
    for message in (durable[0], transient, durable[1]):
        pager.admitted(message)
        message.flags |= JOURNALLED if not message.flags & TRANSIENT else 0
    assert pager.pageable_bytes == 200  # the non-durable body is counted nowhere here
    assert pager.page_out(0) == 200
    assert transient.payload == b"y" * 100 and all(m.payload is None for m in durable)
    pager.removed(transient)  # leaves without touching the durable counts
    assert (pager.pageable_bytes, pager.paged_bytes) == (0, 200)


def test_a_non_durable_arrival_behind_a_cold_tail_is_journalled_and_its_producer_waits_for_the_disk():
    shell = shell_with(record_budget_bytes=1)  # every arrival after the first goes cold
    send(shell, "p0", b"d", durable=True)
    shell.end_batch(0)
    effects = send(shell, "p1", b"t", durable=False)
    [stored] = [e for e in effects if type(e) is Stored]
    assert stored.message.flags & COLD and not stored.message.flags & TRANSIENT
    assert shell.end_batch(0) == []  # not accepted at the batch's end: it waits for its STORE
    shell.batch_ended(1, 0)
    assert AcceptSend("p1") in shell.durable(1, 0)


# ---- the shell: accepted at once, nothing waits for the journal -----------------------------------

def test_a_non_durable_send_on_a_durable_queue_is_accepted_at_its_batch_end_without_the_journal():
    shell = shell_with()
    effects = send(shell, "p1", b"d", durable=True) + send(shell, "p2", b"t", durable=False)
    assert [type(e) for e in effects] == [Declared, Stored]  # the durable one's STORE only
    assert shell.end_batch(0) == [AcceptSend("p2")]  # before any journal answer
    shell.batch_ended(1, 0)
    assert shell.durable(1, 0) == [AcceptSend("p1")]


def test_a_batch_of_non_durable_sends_leaves_nothing_waiting_for_the_journal():
    shell = shell_with()
    shell.end_batch(0)
    for index in range(3):
        send(shell, f"p{index}", b"t", durable=False)
    assert not shell.waiting
    assert shell.end_batch(0) == [AcceptSend("p0"), AcceptSend("p1"), AcceptSend("p2")]


# ---- a mixed group: in order while running, only the durable ones after a restart ------------------

def journal_records(directory, effects: list) -> None:
    """Write the shell's journal records as the executor does (node/amqp/executor.py)."""
    def actions(journal: Journal):
        for effect in effects:
            if type(effect) is Declared:
                journal.declare(effect.values)
            elif type(effect) is Stored:
                journal.store(effect.queue, effect.message)
            elif type(effect) is Removed:
                journal.remove(effect.queue, effect.seq)
    write_and_close(directory, [actions])


def test_a_mixed_group_comes_back_after_a_restart_with_only_its_durable_messages_in_order(tmp_path):
    shell = shell_with()
    kinds = [True, False, False, True, False, True, True, False]
    effects: list = []
    for index, durable in enumerate(kinds):
        effects += send(shell, f"p{index}", b"m%d" % index, durable)
    consumed = shell.broker.attach_consumer("q", "c", False, 0) + shell.broker.set_credit("c", 1, 0)
    [first] = [e for e in consumed if type(e) is Deliver]
    assert first.message.payload == b"m0"
    effects += shell.broker_effects(shell.broker.settle("c", first.delivery_id, Outcome.ACCEPTED, 0))
    journal_records(tmp_path, effects)

    recovery = recovered(tmp_path)
    restarted = Broker()
    restarted.declare_queue(QueueSettings.from_dict(recovery.queues[0]))
    for message in recovery.messages["q"]:
        restarted.restore("q", message)
    after = restarted.attach_consumer("q", "c", False, 0) + restarted.set_credit("c", 10, 0)
    assert [e.message.payload for e in after if type(e) is Deliver] == [b"m3", b"m5", b"m6"]


@hypothesis_settings(max_examples=60, deadline=None)
@given(sends=st.lists(st.tuples(st.sampled_from(["a", "b", "c"]), st.booleans()), min_size=1, max_size=30),
       consumed=st.integers(0, 30))
def test_any_mix_keeps_group_order_and_journals_exactly_the_durable_messages(sends, consumed):
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q", durable=True))
    effects: list = []
    durable_seqs = set()
    for group, durable in sends:
        message = Message(b"%s" % group.encode(), group, transient=not durable)
        effects += broker.enqueue("q", message, 0)
        if durable:
            durable_seqs.add(message.seq)
    assert set(stored_seqs(effects)) == durable_seqs
    delivered = broker.attach_consumer("q", "c", False, 0) + broker.set_credit("c", consumed, 0)
    deliveries = [e for e in delivered if type(e) is Deliver]
    for group in "abc":
        seqs = [d.message.seq for d in deliveries if d.message.group_id == group]
        assert seqs == sorted(seqs)
    for delivery in deliveries:
        effects += broker.settle("c", delivery.delivery_id, Outcome.ACCEPTED, 0)
    removed = {e.seq for e in effects if type(e) is Removed}
    assert removed == {d.message.seq for d in deliveries} & durable_seqs  # a REMOVE only for what was stored


# ---- the cluster: the flag travels to the owner, old senders mean durable ---------------------------

def test_a_forwarded_non_durable_message_keeps_its_flag_on_the_wire_and_an_old_sender_means_durable():
    transient = Message(b"t", "g", seq=5, transient=True)
    durable = Message(b"d", "g", seq=6)
    entries = [entry_of("q", transient), entry_of("q", durable)]
    assert [entry.not_durable for entry in entries] == [True, False]
    assert [entry.not_durable for entry in entries_from_pb(batch_to_pb("n1", entries))] == [True, False]
    old = peer_pb2.ForwardBatch(source_node="n1")
    old.messages.add(forward_seq=1, queue="q", has_group=True, group_id="g", payload=b"x")  # no field 9
    assert entries_from_pb(old)[0].not_durable is False


def test_a_non_durable_send_for_another_owner_is_not_journalled_in_the_outbound_store_and_travels_flagged():
    cluster = protocol("n1")
    routed(cluster, "n2")
    effects = cluster.arrive("p1", "q", "g", Message(b"t", "g", transient=True), False, False, 0)
    assert effects == [AcceptWhenStored("p1", False, False)]  # no seq reservation, no outbound STORE
    effects = cluster.quiesced(0)
    forwards = []
    while effects:  # the batch's flush, then that of the forward seqs' reservation (forwarding.py)
        forwards += [e for e in effects if type(e) is SubmitForward]
        effects = [e for flush in effects if type(flush) is AfterFlush for e in cluster.flushed(flush.what, None, 1)]
    assert [entry.not_durable for entry in forwards[0].entries] == [True]


def test_the_owner_journals_a_forwarded_non_durable_message_in_no_queue_and_keeps_it_in_order():
    owner = protocol("n2")
    entries = [Entry(1, "q", "g", b"t", 0, False, 0, True), Entry(2, "q", "g", b"d", 0, False, 0, False)]
    effects = owner.forward_received("n1", entries, "reply", 0)
    assert [e.message.payload for e in effects if type(e) is Stored and e.queue == "q"] == [b"d"]
    assert [m.payload for m in owner.broker.queues["q"].browse_available()] == [b"t", b"d"]
