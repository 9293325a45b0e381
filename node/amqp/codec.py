"""Reading the few fields dispatch needs from an encoded AMQP message, and rewriting headers.

Rules: a message is decoded once on arrival; what the core keeps is the producer's bytes. Bytes are
re-encoded only when a delivery must differ from what the producer sent (a redelivery's header, or
the first-for-consumer property), so the common path forwards the original encoding untouched.
"""

from __future__ import annotations

from proton import Message as AmqpMessage

from node.core.errors import InvalidField

JMS_GROUP_ID = "JMSXGroupID"
JMS_GROUP_SEQ = "JMSXGroupSeq"
GROUP_SEQUENCE_CLOSE = 0xFFFFFFFF  # AMQP group-sequence that closes a group (Artemis uses JMSXGroupSeq -1)


class Arrival:
    """What dispatch needs from one incoming message."""

    __slots__ = ("address", "group_id", "closes_group", "expires_at_ms")

    def __init__(self, address, group_id, closes_group, expires_at_ms):
        self.address = address
        self.group_id = group_id
        self.closes_group = closes_group
        self.expires_at_ms = expires_at_ms


def read_arrival(payload: bytes, group_header: str, now_ms: int) -> Arrival:
    message = AmqpMessage()
    try:
        message.decode(payload)
    except Exception as error:  # proton raises its own MessageException for undecodable bytes
        raise InvalidField(f"the message could not be decoded as AMQP 1.0: {error}") from None
    properties = message.properties
    if group_header:
        group_id = properties.get(group_header) if properties else None
        source = f"application property {group_header!r}"
    else:
        group_id = message.group_id
        source = "properties.group-id"
        if group_id is None and properties:
            group_id = properties.get(JMS_GROUP_ID)
            source = f"application property {JMS_GROUP_ID!r}"
    if group_id is not None and not isinstance(group_id, str):
        raise InvalidField(f"group id in {source} must be a string, got {type(group_id).__name__}")
    sequence = message.group_sequence
    closes = sequence in (-1, GROUP_SEQUENCE_CLOSE)
    if not closes and properties:
        closes = properties.get(JMS_GROUP_SEQ) == -1
    expires_at_ms = 0
    if message.ttl:
        expires_at_ms = now_ms + int(message.ttl * 1000)
    if message.expiry_time:
        absolute_ms = int(message.expiry_time * 1000)
        expires_at_ms = min(expires_at_ms, absolute_ms) if expires_at_ms else absolute_ms
    return Arrival(message.address, group_id, closes, expires_at_ms)


def rewrite_for_delivery(payload: bytes, delivery_count: int, first_key: str) -> bytes:
    message = AmqpMessage()
    message.decode(payload)
    if delivery_count:
        message.delivery_count = delivery_count
        message.first_acquirer = False
    if first_key:
        properties = dict(message.properties or {})
        properties[first_key] = True
        message.properties = properties
    return message.encode()
