"""Node-wide limits answered over AMQP: a message over the size limit is refused, nothing else is."""

from proton import Delivery, Message

from tests.integration.harness import connect, send_outcome

MESSAGE_SIZE_MAX_BYTES = 16 << 20


def test_a_message_over_the_size_limit_is_rejected_and_the_next_one_is_accepted(node):
    connection = connect(node, timeout_s=30)
    try:
        sender = connection.create_sender("sizes")
        state, condition = send_outcome(sender, Message(body=b"x" * (MESSAGE_SIZE_MAX_BYTES + 1024)), 30)
        assert (state, condition) == (Delivery.REJECTED, "amqp:resource-limit-exceeded")
        state, condition = send_outcome(sender, Message(body=b"small", group_id="g"))
        assert (state, condition) == (Delivery.ACCEPTED, None)
    finally:
        connection.close()


def _peak_resident_bytes(pid: int) -> int:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc status")


OVERSIZE_BYTES = 48 << 20  # three times the limit, sent in 32 KiB frames; held whole it would cost 3 copies
PEAK_GROWTH_MAX_BYTES = 64 << 20  # the limit's worth held, proton's session window, buffers: not the message


def test_an_oversized_message_is_never_held_whole_and_its_session_keeps_flowing(node):
    """proton buffers a multi-frame message however large; the node reads it out as it comes, keeps
    at most the limit's worth, drops the rest and rejects it at its last frame."""
    peak_before = _peak_resident_bytes(node.process.pid)
    connection = connect(node, timeout_s=60)
    try:
        sender = connection.create_sender("oversized", name="big")
        other = connection.create_sender("oversized", name="small")  # same session
        state, condition = send_outcome(sender, Message(body=b"x" * OVERSIZE_BYTES), 60)
        assert (state, condition) == (Delivery.REJECTED, "amqp:resource-limit-exceeded")
        assert send_outcome(other, Message(body="after", group_id="g")) == (Delivery.ACCEPTED, None)
        assert send_outcome(sender, Message(body="again", group_id="g")) == (Delivery.ACCEPTED, None)
    finally:
        connection.close()
    assert _peak_resident_bytes(node.process.pid) - peak_before < PEAK_GROWTH_MAX_BYTES
