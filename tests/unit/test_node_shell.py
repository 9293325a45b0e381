"""NodeShell: the commit cycle as a pure object (node/core/shell.py), driven here as the engine loop drives it.

Sends in, effects out, the journal's answers back: a producer is accepted only once its batch is on
disk, a failed batch takes back what nobody has seen and says when a consumer had it, declarations
precede their messages, and the cluster protocol's sends never leave the shell.
"""

from __future__ import annotations

from node.core.dispatch.broker import Broker
from node.core.durability import Durability
from node.core.effects import (AcceptSend, AcceptWhenStored, AfterFlush, CloseUnstored, Confirm, Declared, Deliver,
                               EnqueueLocal, Flushed, Refuse, RefuseUnstored, Removed, StopNode, Stored, SubmitForward,
                               Unconfirmed, Withdrawn, WriteFailed)
from node.core.errors import NotFound
from node.core.dispatch.message import JOURNALLED, Message, Outcome
from node.core.dispatch.settings import QueueSettings
from node.core.shell import NodeShell


def shell_with(durable: bool = True, protocol=None, **broker_options):
    broker = Broker(**broker_options)
    broker.declare_queue(QueueSettings(name="q", durable=durable))
    return NodeShell(broker, Durability(retry_interval_ms=1000), journalled=True, protocol=protocol)


def kinds(effects: list) -> list:
    return [type(effect) for effect in effects]


def test_a_durable_send_is_accepted_once_its_batch_is_on_disk_and_its_queue_declared_before_it():
    shell = shell_with()
    message = Message(b"m1", "g")
    effects = shell.enqueue_local("p1", "q", message, True, False, now_ms=0)
    assert kinds(effects) == [Declared, Stored]  # the queue's record first, then its message's
    assert effects[0].values["name"] == "q"
    assert shell.end_batch(0) == [] and shell.waiting
    assert shell.batch_ended(1, 0) == []  # handed over, not on disk yet
    assert shell.durable(1, 0) == [AcceptSend("p1")]


def test_a_non_durable_send_is_accepted_at_the_end_of_its_batch_and_a_presettled_one_at_once():
    shell = shell_with(durable=False)
    effects = shell.enqueue_local("p1", "q", Message(b"m1", "g"), False, False, now_ms=0)
    assert AcceptSend("p1") not in effects
    assert shell.enqueue_local("p2", "q", Message(b"m2", "g"), False, True, now_ms=0)[0] == AcceptSend("p2", False)
    assert shell.end_batch(0) == [AcceptSend("p1")]
    assert shell.end_batch(0) == []


def test_a_refused_send_goes_nowhere_and_its_producer_is_refused():
    shell = shell_with(auto_create=False)
    [refused] = shell.enqueue_local("p1", "nowhere", Message(b"m1", "g"), True, False, now_ms=0)
    assert type(refused) is Refuse and refused.incoming == "p1" and isinstance(refused.error, NotFound)
    assert not shell.waiting


def test_a_failed_batch_takes_back_the_unseen_send_and_says_the_outcome_is_unknown_for_the_delivered_one():
    shell = shell_with()
    broker = shell.broker
    shell.enqueue_local("p1", "q", Message(b"m1", "g1"), True, False, now_ms=0)
    delivered = broker.attach_consumer("q", "c", False, 0) + broker.set_credit("c", 1, 0)
    assert kinds(delivered) == [Deliver]
    shell.enqueue_local("p2", "q", Message(b"m2", "g2"), True, False, now_ms=0)  # no credit left: unseen
    settled = broker.settle("c", delivered[0].delivery_id, Outcome.ACCEPTED, 0)
    assert Removed in kinds(settled)
    shell.consumer_waits(("c", "d1"))  # its settlement waits for the REMOVE
    shell.after_flush("callback")
    shell.batch_ended(1, 0)
    effects = shell.failed(1, "disk on fire", 0)
    assert effects[0] == WriteFailed("disk on fire", taken_back=1, outcome_unknown=1)
    refusals = [effect for effect in effects if type(effect) is RefuseUnstored]
    assert [(r.incoming, r.error.outcome_unknown) for r in refusals] == [("p1", True), ("p2", False)]
    assert Unconfirmed(("c", "d1")) in effects and Flushed("callback", "disk on fire") in effects
    assert Withdrawn in kinds(effects)  # m2, never stored
    assert effects[-1] == CloseUnstored([("c", "d1")], "disk on fire")  # after the take-back's effects
    assert shell.refusing(1) == "disk on fire" and shell.refusing(1000) is None


def test_a_consumers_settlement_is_confirmed_once_its_removal_is_on_disk():
    shell = shell_with()
    shell.consumer_waits(("c", "d1"))
    shell.batch_ended(3, 0)
    assert shell.durable(2, 0) == []
    assert shell.durable(3, 0) == [Confirm(("c", "d1"))]


def test_a_waiter_of_a_batch_that_wrote_nothing_new_is_released_when_its_ticket_is_on_disk_already():
    shell = shell_with()
    shell.durable(4, 0)
    shell.after_flush("callback")
    assert shell.batch_ended(4, 0) == [Flushed("callback", None)]


class Protocol:
    """The cluster protocol's side the shell calls: its effects are scripted."""

    batch_due = False

    def __init__(self):
        self.flushed_with: list = []

    def flushed(self, what, reason, now_ms):
        self.flushed_with.append((what, reason))
        return [SubmitForward("n2", [what])]


def test_the_protocols_sends_stay_in_the_shell_and_its_journal_records_leave_in_order():
    protocol = Protocol()
    shell = shell_with(protocol=protocol)
    shell.end_batch(0)  # the queue's declaration
    message, forwarded = Message(b"m1", "g"), Message(b"m2", "g")
    kept = Message(b"out", "g", seq=7)
    effects = shell.from_protocol([
        EnqueueLocal("p1", "q", message, True, False, 0), AcceptWhenStored("p2", True, False),
        Stored("\x00out\x00n2\x00q", kept, ("n3", 4)), Removed("\x00out\x00n2\x00q", 6),
        Declared({"name": "\x00mark\x00n3", "high_water": 4}), AfterFlush("continuation"),
        Stored("q", forwarded, ("n3", 5)), Refuse("p3", NotFound("no")), StopNode("broken"), SubmitForward("n2", [])])
    assert kinds(effects) == [Stored, Stored, Removed, Declared, Stored, Refuse, StopNode]  # nothing after the stop
    assert effects[1] == Stored("\x00out\x00n2\x00q", kept, ("n3", 4))
    shell.batch_ended(1, 0)
    assert shell.durable(1, 0) == [AcceptSend("p1"), AcceptSend("p2"), SubmitForward("n2", ["continuation"])]
    assert protocol.flushed_with == [("continuation", None)]
    # the queue's messages are journalled now (their bodies may page out); the cluster's own record is not the broker's
    assert message.flags & JOURNALLED and forwarded.flags & JOURNALLED and not kept.flags & JOURNALLED
