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
