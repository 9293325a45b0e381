"""Reading the few fields dispatch needs from an encoded AMQP message, and rewriting headers.

Rules:
- A message is read once on arrival. What the core keeps is the producer's bytes. The scanner
  below walks the AMQP 1.0 type encoding (node/amqp/type_encoding.py) only as far as the header,
  properties and application properties sections and never decodes the body: a full proton decode
  costs ~30 us per message, most of it building Python objects that dispatch never looks at.
- Input the scanner does not understand (a symbolic section descriptor, or truncated bytes) goes
  to proton's decoder instead, which either reads it or raises. Either way the caller gets
  InvalidField with a description.
- Bytes are re-encoded only when a delivery must differ from what the producer sent: a
  redelivery's header, or the first-for-consumer property.
- A dead letter's copy is rewritten once, when it moves, to carry its original queue and the reason
  (`x-opt-original-queue`, `x-opt-dead-letter-reason`); that copy is what the dead-letter queue
  stores and journals, so the record survives a restart. Dead letters are rare: proton encodes them.
- Every delivery carries the node's enqueue time as the message annotation `x-opt-enqueued-time`
  (a timestamp, ms). It is spliced into the bytes: a message-annotations section is added, or the
  producer's map gains (or replaces) that one entry. What the splice cannot read goes through
  proton; the core's copy stays the producer's bytes.
"""

from __future__ import annotations

from proton import Message as AmqpMessage
from proton import symbol, timestamp

from node.amqp.type_encoding import Malformed, Unreadable, compound, list_items, map_values, read_value, skip_value
from node.core.errors import InvalidField

JMS_GROUP_ID = "JMSXGroupID"
JMS_GROUP_SEQ = "JMSXGroupSeq"
GROUP_SEQUENCE_CLOSE = 0xFFFFFFFF  # AMQP group-sequence that closes a group (Artemis uses JMSXGroupSeq -1)

_HEADER, _DELIVERY_ANNOTATIONS, _MESSAGE_ANNOTATIONS = 0x70, 0x71, 0x72
_PROPERTIES, _APPLICATION_PROPERTIES, _FIRST_BODY_SECTION = 0x73, 0x74, 0x75
ENQUEUED_TIME_ANNOTATION = "x-opt-enqueued-time"
# what a dead letter records (message annotations, strings): where it was and why it left
ORIGINAL_QUEUE_ANNOTATION = "x-opt-original-queue"
DEAD_LETTER_REASON_ANNOTATION = "x-opt-dead-letter-reason"
_ENQUEUED_TIME_KEY = b"\xa3" + bytes([len(ENQUEUED_TIME_ANNOTATION)]) + ENQUEUED_TIME_ANNOTATION.encode()  # sym8
_MAP8_CONTENT_BYTES_MAX = 255  # a map8's size and count are one byte each
_JMS_GROUP_ID_BYTES = JMS_GROUP_ID.encode()
_JMS_GROUP_SEQ_BYTES = JMS_GROUP_SEQ.encode()


class Arrival:
    """What dispatch needs from one incoming message. `durable`: the header's durable field; absent (no
    header, or no field) is false, as AMQP 1.0 defines it (3.2.1) and ActiveMQ Artemis reads it."""

    __slots__ = ("address", "group_id", "closes_group", "expires_at_ms", "durable")

    def __init__(self, address, group_id, closes_group, expires_at_ms, durable=False):
        self.address = address
        self.group_id = group_id
        self.closes_group = closes_group
        self.expires_at_ms = expires_at_ms
        self.durable = durable


def read_arrival(payload: bytes, group_header: str, now_ms: int) -> Arrival:
    try:
        fields = _scan(payload, group_header)
    except Unreadable:
        fields = _decode_with_proton(payload, group_header)
    except (Malformed, IndexError, ValueError) as error:
        # proton's decoder accepts some garbage silently, so structural errors are final here
        raise InvalidField(f"the message is not valid AMQP 1.0 ({error or 'truncated'}); "
                           f"send an encoded AMQP message") from None
    (ttl_ms, address, absolute_expiry_ms, group_id, group_sequence, header_value, jms_group_id, jms_seq,
     durable) = fields
    if group_header:
        source = f"application property {group_header!r}"
        group_id = header_value
    else:
        source = "properties.group-id"
        if group_id is None and jms_group_id is not None:
            group_id, source = jms_group_id, f"application property {JMS_GROUP_ID!r}"
    if group_id is not None and not isinstance(group_id, str):
        raise InvalidField(f"group id in {source} must be a string, got {type(group_id).__name__}")
    closes = group_sequence == GROUP_SEQUENCE_CLOSE or jms_seq == -1
    expires_at_ms = now_ms + ttl_ms if ttl_ms else 0
    if absolute_expiry_ms:
        expires_at_ms = min(expires_at_ms, absolute_expiry_ms) if expires_at_ms else absolute_expiry_ms
    return Arrival(address, group_id, closes, expires_at_ms, durable)


TRACE_PRODUCER_KEY, TRACE_SEQUENCE_KEY = "producer", "sequence"  # the identity a trace line names (README "Auditing")
_TRACE_KEYS = {TRACE_PRODUCER_KEY: 0, TRACE_SEQUENCE_KEY: 1}


def read_trace_identity(payload: bytes) -> tuple:
    """(producer, sequence) from the application properties, for a traced queue's trace lines only: None
    for either when absent or of another type (a string, an integer). Never raises: a trace takes what it can."""
    try:
        position, end = 0, len(payload)
        while position < end:
            if payload[position] != 0x00 or payload[position + 1] != 0x53:
                raise Unreadable("a section the scanner does not walk")
            section, position = payload[position + 2], position + 3
            if section >= _APPLICATION_PROPERTIES:
                if section == _APPLICATION_PROPERTIES:
                    (producer, sequence, _), _ = map_values(payload, position, _TRACE_KEYS)
                    return _trace_identity(producer, sequence)
                return None, None
            position = skip_value(payload, position)
        return None, None
    except (Unreadable, Malformed, IndexError, ValueError):
        message = AmqpMessage()
        try:
            message.decode(payload)
        except Exception:  # proton's own MessageException: the send was refused already, or never decoded
            return None, None
        properties = message.properties or {}
        return _trace_identity(properties.get(TRACE_PRODUCER_KEY), properties.get(TRACE_SEQUENCE_KEY))


def _trace_identity(producer, sequence) -> tuple:
    return (producer if isinstance(producer, str) else None,
            sequence if isinstance(sequence, int) and not isinstance(sequence, bool) else None)


def _scan(buf: bytes, group_header: str) -> tuple:
    ttl_ms = absolute_expiry_ms = 0
    durable = False  # no header section: AMQP's default
    address = group_id = group_sequence = header_value = jms_group_id = jms_seq = None
    wanted_keys = {}
    if group_header:
        wanted_keys[group_header] = 0
    elif _JMS_GROUP_ID_BYTES in buf:
        wanted_keys[JMS_GROUP_ID] = 1
    if _JMS_GROUP_SEQ_BYTES in buf:
        wanted_keys[JMS_GROUP_SEQ] = 2
    position, end = 0, len(buf)
    if not end:
        raise Malformed("no sections")
    while position < end:
        if buf[position] != 0x00:
            raise Malformed(f"byte {position} should start a described section")
        descriptor_code = buf[position + 1]
        if descriptor_code == 0x53:  # smallulong
            section, position = buf[position + 2], position + 3
        elif descriptor_code == 0x80:  # ulong
            section, position = int.from_bytes(buf[position + 2:position + 10], "big"), position + 10
        else:
            raise Unreadable("symbolic section descriptor")
        if section >= _FIRST_BODY_SECTION:
            break  # the body and footer hold nothing dispatch needs
        if section == _HEADER:
            items, position = list_items(buf, position, 3)
            durable = items[0] is True  # only the durable bit and the ttl are read of the header
            ttl_ms = items[2] or 0
        elif section == _PROPERTIES:
            items, position = list_items(buf, position, 12)
            address, absolute_expiry_ms, group_id, group_sequence = items[2], items[8] or 0, items[10], items[11]
            if ... in (address, group_id, group_sequence) or absolute_expiry_ms is ...:
                raise Unreadable("a properties field of an unexpected type")
        elif section == _APPLICATION_PROPERTIES and wanted_keys:
            found, position = map_values(buf, position, wanted_keys)
            header_value, jms_group_id, jms_seq = found
        else:
            position = skip_value(buf, position)
    return (ttl_ms, address, absolute_expiry_ms, group_id, group_sequence, header_value, jms_group_id, jms_seq,
            durable)


def _decode_with_proton(payload: bytes, group_header: str) -> tuple:
    message = AmqpMessage()
    try:
        message.decode(payload)
    except Exception as error:  # proton raises its own MessageException for undecodable bytes
        raise InvalidField(f"the message could not be decoded as AMQP 1.0: {error}") from None
    properties = message.properties or {}
    sequence = message.group_sequence
    return (int(message.ttl * 1000) if message.ttl else 0, message.address,
            int(message.expiry_time * 1000) if message.expiry_time else 0, message.group_id,
            GROUP_SEQUENCE_CLOSE if sequence in (-1, GROUP_SEQUENCE_CLOSE) else sequence,
            properties.get(group_header) if group_header else None,
            properties.get(JMS_GROUP_ID), properties.get(JMS_GROUP_SEQ), bool(message.durable))


def stamp_enqueued_time(payload: bytes, enqueued_at_ms: int) -> bytes:
    """The payload with message annotation x-opt-enqueued-time = `enqueued_at_ms` (see the rules)."""
    entry = _ENQUEUED_TIME_KEY + b"\x83" + enqueued_at_ms.to_bytes(8, "big", signed=True)
    try:
        return _splice_annotation(payload, entry)
    except (Unreadable, Malformed, IndexError, ValueError):
        message = AmqpMessage()
        message.decode(payload)
        annotations = dict(message.annotations or {})
        annotations[symbol(ENQUEUED_TIME_ANNOTATION)] = timestamp(enqueued_at_ms)
        message.annotations = annotations
        return bytes(message.encode())  # proton's encode gives a bytearray; pn_link_send takes bytes only


def _splice_annotation(buf: bytes, entry: bytes) -> bytes:
    """Add `entry` (an encoded key and value) to the message annotations, dropping an entry with its key."""
    position = 0
    while True:  # past the header and the delivery annotations, which precede the message annotations
        if buf[position] != 0x00 or buf[position + 1] != 0x53:
            raise Unreadable("a section descriptor the splice does not read")
        section = buf[position + 2]
        if section not in (_HEADER, _DELIVERY_ANNOTATIONS):
            break
        position = skip_value(buf, position + 3)
    if section != _MESSAGE_ANNOTATIONS:
        return b"".join((buf[:position], b"\x00\x53\x72", _map_bytes(2, entry), buf[position:]))
    end, count, item = compound(buf, position + 3, 0xC1, 0xD1, "a message-annotations section that is not a map")
    kept, kept_count = [], 0
    for _ in range(count // 2):
        key, value_at = read_value(buf, item)
        pair_end = skip_value(buf, value_at)
        if not (key == ENQUEUED_TIME_ANNOTATION and buf[item] in (0xA3, 0xB3)):  # a symbol, sym8 or sym32
            kept.append(buf[item:pair_end])
            kept_count += 2
        item = pair_end
    kept.append(entry)
    return b"".join((buf[:position + 3], _map_bytes(kept_count + 2, b"".join(kept)), buf[end:]))


def _map_bytes(count: int, content: bytes) -> bytes:
    if len(content) + 1 <= _MAP8_CONTENT_BYTES_MAX and count <= _MAP8_CONTENT_BYTES_MAX:
        return bytes((0xC1, len(content) + 1, count)) + content
    return b"\xd1" + (len(content) + 4).to_bytes(4, "big") + count.to_bytes(4, "big") + content


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
    return bytes(message.encode())  # as in stamp_enqueued_time


def stamp_dead_letter(payload: bytes, original_queue: str, reason: str) -> bytes:
    """The dead-letter copy of a message: the producer's message plus where it was and why it left.
    A payload proton cannot read is kept as it is: a dead letter must never be lost to its stamp."""
    message = AmqpMessage()
    try:
        message.decode(payload)
    except Exception:  # noqa: BLE001 - proton raises several types; the copy goes unstamped
        return payload
    annotations = dict(message.annotations or {})
    annotations[symbol(ORIGINAL_QUEUE_ANNOTATION)] = original_queue
    annotations[symbol(DEAD_LETTER_REASON_ANNOTATION)] = reason
    message.annotations = annotations
    return bytes(message.encode())
