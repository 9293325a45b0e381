"""A real node whose disk is full: a send its journal could not store is refused, and never delivered.

The node's data directory is on a small tmpfs that the test fills to the last byte, so the journal's
write fails with ENOSPC as on a real disk (mounting needs root: see tests/integration/faults.py).
What is checked, per the rules of node/amqp/loop.py: a send refused because its batch failed is taken
back and never reaches a consumer, not even one attached while the disk is full; a send a consumer
had before the write failed is refused as "outcome unknown", and once the disk has room its removal
(of a seq the journal never stored) leaves nothing behind after a restart; an acceptance whose removal
could not be stored is never settled (the consumer's link is detached), so the message that comes
back after a restart is one the consumer was never told was gone; a `grouper queue purge` whose
removals could not be stored fails, naming the journal's failure, instead of reporting them purged.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

import pytest
from proton import Delivery, Message

from tests.integration.faults import cannot_run, mount_tmpfs, unmount
from tests.integration.harness import ManualReceiver, NodeProcess, connect

DISK_BYTES = 4 << 20  # the tmpfs the node's data directory is on
# larger than the slack in the journal file's last page, so its write needs a page the disk lacks
REFUSED_BODY_BYTES = 64 << 10
FILL_CHUNK_BYTES = 1 << 20  # the filler is written in chunks halving from this down to one byte
RETRY_WAIT_S = 10.0  # the node refuses durable sends for 1 s after a failed write; then they are tried again
SEND_TIMEOUT_S = 10.0
QUEUE = "orders"


@pytest.fixture
def small_disk(tmp_path):
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    reason = mount_tmpfs(mount_point, DISK_BYTES)
    if reason:
        cannot_run("a full-disk test", reason)
    yield mount_point
    unmount(mount_point)


@pytest.fixture
def full_disk_node(small_disk):
    node = NodeProcess(small_disk / "node")
    node.start()
    yield node
    node.kill()


def fill(directory: Path) -> Path:
    """Take every free byte of the file system `directory` is on; remove the returned file to free them."""
    filler = directory / "filler"
    descriptor = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        chunk_bytes = FILL_CHUNK_BYTES
        while chunk_bytes:
            try:
                os.write(descriptor, b"\0" * chunk_bytes)
            except OSError as error:
                assert error.errno == errno.ENOSPC, error
                chunk_bytes //= 2
    finally:
        os.close(descriptor)
    return filler


def send(sender, body, group: str = "g") -> tuple:
    """(remote state, condition name, condition description) once the node settles the send."""
    # durable: journalled, so refused while the journal cannot write
    delivery = sender.link.send(Message(body=body, group_id=group, durable=True))
    sender.connection.wait(lambda: delivery.settled, timeout=SEND_TIMEOUT_S, msg="a send's outcome")
    condition = delivery.remote.condition
    delivery.settle()
    if condition is None:
        return delivery.remote_state, None, None
    return delivery.remote_state, condition.name, condition.description


def send_once_the_disk_takes_it(sender, body) -> None:
    """After a failed write the node refuses durable sends for a while (each refused before it is queued)."""
    deadline = time.monotonic() + RETRY_WAIT_S
    while True:
        outcome = send(sender, body)
        if outcome[0] == Delivery.ACCEPTED:
            return
        assert outcome[1] == "amqp:resource-limit-exceeded", outcome
        assert time.monotonic() < deadline, f"still refused {RETRY_WAIT_S} s after the disk was freed: {outcome}"
        time.sleep(0.1)


def served_after_restart(node: NodeProcess) -> list:
    """Restart the node and return the bodies a fresh consumer of QUEUE gets, in order."""
    node.restart()
    connection = connect(node)
    try:
        return [held.body for held in ManualReceiver(connection, QUEUE, "after-restart").poll_all()]
    finally:
        connection.close()


def test_a_send_refused_by_a_full_disk_is_never_delivered_to_a_consumer_attached_while_the_disk_is_full(
        full_disk_node, small_disk):
    connection = connect(full_disk_node)
    try:
        sender = connection.create_sender(QUEUE)
        assert send(sender, "before")[0] == Delivery.ACCEPTED  # queued: nobody consumes yet
        filler = fill(small_disk)

        state, condition, description = send(sender, "r" * REFUSED_BODY_BYTES)
        assert (state, condition) == (Delivery.REJECTED, "amqp:resource-limit-exceeded"), description
        assert "disk full" in description and "will not be delivered" in description, description

        consumer = ManualReceiver(connection, QUEUE, "consumer", credit=10)  # while the disk is still full
        os.remove(filler)
        send_once_the_disk_takes_it(sender, "after")
        bodies = []
        while "after" not in bodies:
            bodies.append(consumer.fetch().body)
        # one group, delivered in order to a consumer with credit: had the refused send stayed queued, it
        # would have come between the two
        assert bodies == ["before", "after"]
    finally:
        connection.close()


def test_a_send_a_consumer_had_before_the_disk_filled_is_refused_as_outcome_unknown_and_not_recovered(
        full_disk_node, small_disk):
    connection = connect(full_disk_node)
    try:
        consumer = ManualReceiver(connection, QUEUE, "consumer", credit=10)
        sender = connection.create_sender(QUEUE)
        assert send(sender, "first")[0] == Delivery.ACCEPTED
        consumer.fetch().accept()
        filler = fill(small_disk)

        body = "d" * REFUSED_BODY_BYTES
        state, condition, description = send(sender, body)  # delivered at once, before the write fails
        assert (state, condition) == (Delivery.REJECTED, "amqp:resource-limit-exceeded"), description
        assert description.startswith("outcome unknown") and "may deliver it twice" in description, description
        [delivered] = consumer.take_arrived()
        assert delivered.body == body

        os.remove(filler)
        send_once_the_disk_takes_it(sender, "later")
        delivered.accept()  # its REMOVE names a seq the journal never stored
        assert consumer.fetch().body == "later"  # left unsettled: it comes back after the restart
    finally:
        connection.close()
    assert served_after_restart(full_disk_node) == ["later"]  # unsettled before: back; nothing else


ACCEPTED_AT_ONCE = 300  # their removals (32 bytes each) need more than the slack in the journal's last page


def test_an_acceptance_whose_removal_the_full_disk_refused_is_not_settled_and_the_message_comes_back(
        full_disk_node, small_disk):
    connection = connect(full_disk_node)
    try:
        sender = connection.create_sender(QUEUE)
        for index in range(ACCEPTED_AT_ONCE):
            assert send(sender, f"m{index}")[0] == Delivery.ACCEPTED
        consumer = ManualReceiver(connection, QUEUE, "consumer", credit=ACCEPTED_AT_ONCE)
        connection.wait(lambda: consumer.arrived_count == ACCEPTED_AT_ONCE, timeout=SEND_TIMEOUT_S,
                        msg="every message delivered")
        held = consumer.take_arrived()
        filler = fill(small_disk)
        for message in held:  # accepted, left unsettled: the node settles each once its removal is stored
            message.delivery.update(Delivery.ACCEPTED)
        connection.wait(lambda: consumer.detached or all(message.delivery.settled for message in held),
                        timeout=SEND_TIMEOUT_S, msg="the node's settlements or its detach")
        assert consumer.detached, "the node settled every acceptance although the disk was full"
        condition = consumer.detach_condition
        assert condition is not None and condition.name == "amqp:resource-limit-exceeded", condition
        assert "may be delivered again" in condition.description, condition.description
        settled = {message.body for message in held if message.delivery.settled}  # settled by the node
        unsettled = [message.body for message in held if message.body not in settled]
        assert unsettled, "every removal was stored although the disk was full"
        os.remove(filler)
    finally:
        connection.close()
    back = served_after_restart(full_disk_node)
    # what the node settled is gone for good; what it left unsettled may come back, and here it does
    assert not set(back) & settled, sorted(set(back) & settled)[:5]
    assert back == unsettled


def test_a_queue_purge_whose_removals_the_full_disk_refused_fails_naming_the_journal_and_comes_back(
        full_disk_node, small_disk):
    connection = connect(full_disk_node)
    try:
        sender = connection.create_sender(QUEUE)
        for index in range(ACCEPTED_AT_ONCE):
            assert send(sender, f"m{index}", group=f"g{index % 6}")[0] == Delivery.ACCEPTED
    finally:
        connection.close()
    filler = fill(small_disk)
    purge = full_disk_node.cli("queue", "purge", QUEUE)
    os.remove(filler)
    # not "purged 300": the operator is told the purge is not stored, and why
    assert purge.returncode != 0 and not purge.stdout, (purge.stdout, purge.stderr)
    assert f"the journal could not write the purge of queue {QUEUE!r} (disk full" in purge.stderr, purge.stderr
    assert "300 messages purged in memory" in purge.stderr and "free the node's disk" in purge.stderr, purge.stderr
    # as the error says: a restart brings the purge's messages back, nothing lost
    assert len(served_after_restart(full_disk_node)) == ACCEPTED_AT_ONCE
