"""LoopControl's removals answer only once the journal has them on disk (node/admin/flushes.py).

A fake engine loop over a real Broker: the bridge runs each closure inline and then ends the batch as
AmqpServer does, handing the records journalled in it to a fake journal that writes them (or fails, or
never reports) and calling the `after_flush` waiters with the outcome.
"""

from __future__ import annotations

from types import SimpleNamespace

import grpc
import pytest

from node.admin import queue_purge
from node.admin.flushes import Flushes, JournalFailed
from node.admin.service import _message_for, status_for
from node.core.dispatch.broker import Broker
from node.core.effects import Removed, Stored
from node.core.dispatch.message import Message
from node.core.dispatch.settings import QueueSettings
from node.admin.loop_control import LoopControl

WRITTEN, FAILED, SILENT = "written", "failed", "silent"  # what the fake journal does with a batch


class FakeLoop:
    """AmqpServer's part in an admin call: apply, after_flush, and the batch that ends each bridge call."""

    def __init__(self, broker: Broker, outcome: str = WRITTEN):
        self.broker = broker
        self.outcome = outcome
        self.pending: list = []  # journal records of the batch being built: ("store" | "remove", queue, seq)
        self.on_disk: list = []
        self.waiters: list = []
        self.batches_flushed = 0

    def apply(self, effects: list) -> None:
        for effect in effects:
            if type(effect) is Removed:
                self.pending.append(("remove", effect.queue, effect.seq))
            elif type(effect) is Stored:
                self.pending.append(("store", effect.queue, effect.message.seq))

    def after_flush(self, fn) -> None:
        self.waiters.append(fn)

    def detach_producers_of(self, name: str) -> None:
        pass

    def call(self, fn, timeout_ms: int):
        result = fn()
        self._end_batch()
        return result

    def _end_batch(self) -> None:
        waiters, self.waiters = self.waiters, []
        if not waiters:
            return  # nobody waits: the records are held for the tick's batch (which a kill -9 may beat)
        self.batches_flushed += 1
        if self.outcome == SILENT:
            return
        if self.outcome == WRITTEN:
            self.on_disk += self.pending
        self.pending = []
        for fn in waiters:
            fn(None if self.outcome == WRITTEN else "No space left on device")


def control(broker: Broker, outcome: str = WRITTEN, admin_timeout_ms: int = 2000) -> tuple[LoopControl, FakeLoop]:
    loop = FakeLoop(broker, outcome)
    journal = SimpleNamespace(delete=lambda name: loop.pending.append(("delete", name, 0)))
    node = SimpleNamespace(broker=broker, server=loop, journal=journal, handler=None, cluster=None,
                           clock_ms=lambda: 1000, config=SimpleNamespace(admin_timeout_ms=admin_timeout_ms),
                           bridge=SimpleNamespace(call=loop.call))
    return LoopControl(node), loop


def filled(durable: bool = True, groups: int = 3, per_group: int = 4) -> Broker:
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q", durable=durable))
    broker.declare_queue(QueueSettings(name="dest", durable=durable))
    for seq in range(per_group):
        for group in range(groups):
            broker.enqueue("q", Message(f"{group}-{seq}".encode(), f"g{group}"), 1000)
    return broker


def removed_seqs(loop: FakeLoop, queue: str = "q") -> set[int]:
    return {seq for kind, name, seq in loop.on_disk if kind == "remove" and name == queue}


def test_a_queue_purge_answers_with_every_removal_on_disk():
    broker = filled()
    seqs = {message.seq for message in broker.queue("q")._store.log}
    admin, loop = control(broker)
    assert admin.purge_queue("q") == (12, 0)
    assert removed_seqs(loop) == seqs and loop.pending == []


def test_a_queue_purge_of_many_batches_waits_for_each_batchs_unit(monkeypatch):
    monkeypatch.setattr(queue_purge.purge_batch, "__defaults__", (2,))  # groups_max: 2 groups a batch
    broker = filled(groups=5, per_group=2)
    admin, loop = control(broker)
    assert admin.purge_queue("q") == (10, 0)
    assert len(removed_seqs(loop)) == 10 and loop.batches_flushed == 3  # 2 + 2 + 1 groups


def test_a_failed_write_fails_the_purge_naming_the_journal_failure_and_the_queue():
    admin, _ = control(filled(), outcome=FAILED)
    with pytest.raises(JournalFailed) as failure:
        admin.purge_queue("q")
    description = failure.value.description
    assert "No space left on device" in description and "'q'" in description and "12 messages" in description
    assert failure.value.retriable and failure.value.fault == "node"


def test_a_journal_that_never_reports_times_the_purge_out_instead_of_answering():
    admin, _ = control(filled(), outcome=SILENT, admin_timeout_ms=50)
    with pytest.raises(TimeoutError, match="admin_timeout_ms"):
        admin.purge_queue("q")


def test_a_non_durable_queue_purge_waits_for_nothing():
    admin, loop = control(filled(durable=False), outcome=SILENT)  # a wait would time out
    assert admin.purge_queue("q") == (12, 0)
    assert loop.batches_flushed == 0 and loop.on_disk == []


def test_a_group_purge_answers_with_its_removals_on_disk():
    broker = filled()
    admin, loop = control(broker)
    assert admin.purge_group("q", "g1", 3) == 3
    assert len(removed_seqs(loop)) == 3 and loop.pending == []
    with pytest.raises(JournalFailed, match="group 'g1' of queue 'q'"):
        control(filled(), outcome=FAILED)[0].purge_group("q", "g1", None)


def test_a_group_move_answers_with_its_copies_and_removals_on_disk():
    broker = filled()
    admin, loop = control(broker)
    assert admin.move_group("q", "g2", "dest", None) == 4
    kinds = [(kind, name) for kind, name, _ in loop.on_disk]
    assert kinds == [("store", "dest")] * 4 + [("remove", "q")] * 4  # the copies ahead of the removals
    assert loop.pending == []


def test_a_group_reset_journals_nothing_and_waits_for_nothing():
    admin, loop = control(filled(), outcome=SILENT)
    admin.reset_groups("q", None)
    assert loop.batches_flushed == 0


def test_a_queue_deletion_answers_with_its_delete_record_on_disk():
    admin, loop = control(filled())
    admin.delete_queue("q")
    assert ("delete", "q", 0) in loop.on_disk
    with pytest.raises(JournalFailed, match="deletion of queue 'q'"):
        control(filled(), outcome=FAILED)[0].delete_queue("q")


def test_flushes_with_nothing_registered_wait_for_nothing():
    Flushes().wait(0, "nothing", "nothing")


def test_a_journal_failure_reaches_the_operator_as_resource_exhausted_with_its_text_not_as_a_node_bug():
    error = JournalFailed("the journal could not write the purge of queue 'q' (No space left on device): ...")
    assert status_for(error) is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert _message_for(error, status_for(error)) == error.description
