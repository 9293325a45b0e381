"""Rows to AMQP 1.0 messages and back: the encoding the sink sends and the fields the source reads.

Rules:
- Pure: bytes in, bytes or tuples out; no sockets, no Spark.
- The sink encodes by hand: a header (durable), properties (message-id, creation-time, group-id)
  application properties and one body section. Building a proton `Message` per row costs ~30 us;
  these few fixed layouts cost a few, and a write of a million rows is counted in them. The tests
  check every layout against proton's own decoder.
- A string body travels as an amqp-value string, a binary body as a data section (what JMS
  TextMessage and BytesMessage clients expect). A null body is an amqp-value null.
- The group id goes in `properties.group-id`, or in the application property named by
  `group_header` when the queue reads its groups from one (`--group-header`); a null group is sent
  without one (the queue's default-group rules apply).
- The source reads with proton's decoder: reads are small next to writes, and it accepts every
  encoding another client may have used.
"""

from __future__ import annotations

import datetime
import json
import struct

from proton import Message

JMS_GROUP_ID = "JMSXGroupID"
ENQUEUED_TIME_ANNOTATION = "x-opt-enqueued-time"  # where a node that stamps enqueue times puts them

_HEADER_DURABLE = b"\x00\x53\x70\xc0\x02\x01\x41"  # header section: list [durable = true]
_PROPERTIES = b"\x00\x53\x73"
_APPLICATION_PROPERTIES = b"\x00\x53\x74"
_DATA = b"\x00\x53\x75"
_AMQP_VALUE = b"\x00\x53\x77"
_NULL = b"\x40"
_NULLS_BEFORE_CREATION_TIME = _NULL * 8  # user-id .. absolute-expiry-time
_PACK_LONG = struct.Struct(">q").pack
_PACK_DOUBLE = struct.Struct(">d").pack
_PACK_SIZE = struct.Struct(">I").pack
_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_STR8 = [b"\xa1" + bytes((size,)) for size in range(256)]  # str8 constructor and size byte, by size
_VBIN8 = [b"\xa0" + bytes((size,)) for size in range(256)]


class UnsupportedValue(ValueError):
    """A property value this encoder has no AMQP type for."""


def _string(value: str) -> bytes:
    data = value.encode("utf-8")
    size = len(data)
    if size < 256:
        return _STR8[size] + data
    return b"\xb1" + _PACK_SIZE(len(data)) + data


def _binary(data: bytes) -> bytes:
    size = len(data)
    if size < 256:
        return _VBIN8[size] + data
    return b"\xb0" + _PACK_SIZE(len(data)) + data


def _compound(code8: int, code32: int, count: int, items: bytes) -> bytes:
    if len(items) < 255 and count < 256:
        return bytes((code8, len(items) + 1, count)) + items
    return bytes((code32,)) + _PACK_SIZE(len(items) + 4) + _PACK_SIZE(count) + items


def _value(value) -> bytes:
    if value is None:
        return _NULL
    if value is True:
        return b"\x41"
    if value is False:
        return b"\x42"
    kind = type(value)
    if kind is str:
        return _string(value)
    if kind is int:
        if -128 <= value <= 127:
            return b"\x55" + struct.pack(">b", value)
        return b"\x81" + _PACK_LONG(value)
    if kind is float:
        return b"\x82" + _PACK_DOUBLE(value)
    if kind is bytes or kind is bytearray:
        return _binary(bytes(value))
    if isinstance(value, datetime.datetime):
        return b"\x83" + _PACK_LONG(timestamp_ms(value))
    if isinstance(value, datetime.date):
        return _string(value.isoformat())
    raise UnsupportedValue(f"{type(value).__name__}")


def timestamp_ms(value: datetime.datetime) -> int:
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.timezone.utc)
    return (value - _EPOCH) // datetime.timedelta(milliseconds=1)


def encode(group: str | None, body, properties: dict | None = None, message_id: str | None = None,
           creation_ms: int = 0, durable: bool = True, group_header: str = "") -> bytes:
    """One message as AMQP 1.0 bytes; `body` is str, bytes or None."""
    parts = [_HEADER_DURABLE] if durable else []
    # properties: message-id (0) .. creation-time (9), group-id (10); trailing nulls are left out
    fields = [_string(message_id) if message_id is not None else _NULL]
    if creation_ms or (group is not None and not group_header):
        fields.append(_NULLS_BEFORE_CREATION_TIME)
        fields.append(b"\x83" + _PACK_LONG(creation_ms) if creation_ms else _NULL)
        if group is not None and not group_header:
            fields.append(_string(group))
            count = 11
        else:
            count = 10
    else:
        count = 1 if message_id is not None else 0
        fields = fields if count else []
    if count:
        parts.append(_PROPERTIES + _compound(0xC0, 0xD0, count, b"".join(fields)))
    if group_header and group is not None:
        properties = {**(properties or {}), group_header: group}
    if properties:
        items = b"".join(_string(key) + _value(value) for key, value in properties.items())
        parts.append(_APPLICATION_PROPERTIES + _compound(0xC1, 0xD1, 2 * len(properties), items))
    if body is None:
        parts.append(_AMQP_VALUE + _NULL)
    elif type(body) is str:
        parts.append(_AMQP_VALUE + _string(body))
    else:
        parts.append(_DATA + _binary(bytes(body)))
    return b"".join(parts)


def _property_text(value) -> str | None:
    """Application property values as strings: numbers and booleans as JSON spells them."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (bool, int, float)):
        return json.dumps(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def _timestamp(value) -> datetime.datetime | None:
    """AMQP timestamps arrive as seconds (float) from proton's Message, as ms (int) in annotations."""
    if value is None:
        return None
    if isinstance(value, float):
        return _EPOCH + datetime.timedelta(seconds=value)
    return _EPOCH + datetime.timedelta(milliseconds=int(value))


def decode(payload: bytes, group_header: str = "", body_as_string: bool = False) -> tuple:
    """(group, body, properties, message_id, delivery_count, enqueued_at) of one received message.

    `enqueued_at` is the node's enqueue time when it stamps one (the `x-opt-enqueued-time`
    annotation), else the producer's creation-time (the sink sets it at send), else None."""
    message = Message()
    message.decode(payload)
    properties = message.properties or {}
    if group_header:
        group = properties.get(group_header)
    else:
        group = message.group_id if message.group_id is not None else properties.get(JMS_GROUP_ID)
    body = message.body
    if isinstance(body, memoryview):
        body = bytes(body)
    if body is not None:
        if body_as_string:
            body = body if isinstance(body, str) else bytes(body).decode("utf-8", "replace")
        elif isinstance(body, str):
            body = body.encode("utf-8")
        elif not isinstance(body, bytes):
            body = json.dumps(body, default=str).encode("utf-8")  # an amqp-value of another type
    annotations = message.annotations or {}
    enqueued = annotations.get(ENQUEUED_TIME_ANNOTATION)
    enqueued_at = _timestamp(enqueued) if enqueued is not None else _timestamp(message.creation_time or None)
    return (None if group is None else str(group), body,
            {str(key): _property_text(value) for key, value in properties.items()},
            None if message.id is None else str(message.id), message.delivery_count or 0, enqueued_at)
