"""Load-test messages as AMQP 1.0 bytes, written from per-group templates and read by a field walker.

Rules:
- `MessageEncoder` writes the header and properties once per group and the rest per message; the
  application properties carry SEQ_KEY (the message's number within its group) and SENT_KEY (the
  producer's CLOCK_MONOTONIC send time, ns), which `grouper perf` and bench/ read back.
- `read_fields` looks only at properties.group-id and those two application properties; the body
  is never touched. tests/unit/test_bench_lean.py checks both against proton's own codec.
- Pure: bytes in, bytes out; no proton, no sockets.
"""

from __future__ import annotations

import struct

from node.amqp.codec import skip_value

SENT_KEY = "bench_sent_ns"  # application property: the producer's CLOCK_MONOTONIC send time, ns
SEQ_KEY = "bench_seq"  # application property: the message's number within its group

_DURABLE_HEADER = b"\x00\x53\x70\xc0\x02\x01\x41"  # header section: list [durable = true]
_PROPERTIES, _APPLICATION_PROPERTIES, _FIRST_BODY_SECTION = 0x73, 0x74, 0x75
_GROUP_ID_INDEX = 10  # properties: message-id .. group-id
_SUBJECT_INDEX = 3
_SENT_KEY = SENT_KEY.encode()
_SEQ_KEY = SEQ_KEY.encode()
# application-properties: map8 of {bench_sent_ns: long, bench_seq: long}
_APPLICATION_HEAD = b"\x00\x53\x74\xc1" + bytes((1 + 2 + len(_SENT_KEY) + 9 + 2 + len(_SEQ_KEY) + 9, 4)) \
    + b"\xa1" + bytes((len(_SENT_KEY),)) + _SENT_KEY + b"\x81"
_PACK_TIMES = struct.Struct(f">q{2 + len(_SEQ_KEY) + 1}sq").pack
_SEQ_ITEM = b"\xa1" + bytes((len(_SEQ_KEY),)) + _SEQ_KEY + b"\x81"


def _str8(data: bytes) -> bytes:
    return b"\xa1" + bytes((len(data),)) + data


def _binary(data: bytes) -> bytes:
    if len(data) < 256:
        return b"\xa0" + bytes((len(data),)) + data
    return b"\xb0" + len(data).to_bytes(4, "big") + data


class MessageEncoder:
    """Bench messages as AMQP 1.0 bytes: header and properties once per group, the rest per message."""

    def __init__(self, body_bytes: int, durable: bool, group_as_subject: bool):
        self.header = _DURABLE_HEADER if durable else b""
        self.group_as_subject = group_as_subject  # RabbitMQ's hash exchange routes on the subject
        self.body_section = b"\x00\x53\x75" + _binary(b"x" * body_bytes)
        self._prefixes: dict[str, bytes] = {}

    def prefix(self, group: str) -> bytes:
        prefix = self._prefixes.get(group)
        if prefix is None:
            encoded = _str8(group.encode())
            fields = [b"\x40"] * _GROUP_ID_INDEX + [encoded]
            if self.group_as_subject:
                fields[_SUBJECT_INDEX] = encoded
            items = b"".join(fields)
            prefix = self.header + b"\x00\x53\x73\xc0" + bytes((len(items) + 1, len(fields))) + items
            self._prefixes[group] = prefix
        return prefix

    def encode(self, group: str, sent_ns: int, seq: int) -> bytes:
        return b"".join((self.prefix(group), _APPLICATION_HEAD, _PACK_TIMES(sent_ns, _SEQ_ITEM, seq),
                         self.body_section))


def _compound(buf: bytes, position: int) -> tuple[int, int, int]:
    """A list or map: (end, item count, first item's position)."""
    code = buf[position]
    if code in (0xC0, 0xC1):
        return position + 2 + buf[position + 1], buf[position + 2], position + 3
    if code in (0xD0, 0xD1):
        size = int.from_bytes(buf[position + 1:position + 5], "big")
        return position + 5 + size, int.from_bytes(buf[position + 5:position + 9], "big"), position + 9
    if code == 0x45:  # list0
        return position + 1, 0, position + 1
    raise ValueError(f"format code 0x{code:02x} at byte {position} is not a list or map")


def _integer(buf: bytes, position: int) -> int:
    code = buf[position]
    if code in (0x81, 0x80):
        return int.from_bytes(buf[position + 1:position + 9], "big", signed=code == 0x81)
    if code in (0x55, 0x54):
        return int.from_bytes(buf[position + 1:position + 2], "big", signed=True)
    if code in (0x53, 0x52):
        return buf[position + 1]
    if code in (0x71, 0x70):
        return int.from_bytes(buf[position + 1:position + 5], "big", signed=code == 0x71)
    if code in (0x44, 0x43):
        return 0
    raise ValueError(f"format code 0x{code:02x} at byte {position} is not an integer")


def _group_id(buf: bytes, position: int):
    end, count, item = _compound(buf, position)
    if count <= _GROUP_ID_INDEX:
        return None, end
    for _ in range(_GROUP_ID_INDEX):
        item = item + 1 if buf[item] == 0x40 else skip_value(buf, item)
    code = buf[item]
    if code in (0xA1, 0xA3):
        return buf[item + 2:item + 2 + buf[item + 1]].decode(), end
    if code in (0xB1, 0xB3):
        size = int.from_bytes(buf[item + 1:item + 5], "big")
        return buf[item + 5:item + 5 + size].decode(), end
    return None, end


def _bench_properties(buf: bytes, position: int) -> tuple[int, int]:
    end, count, item = _compound(buf, position)
    seq, sent_ns = -1, 0
    for _ in range(count // 2):
        code = buf[item]
        if code in (0xA1, 0xA3):
            key_end = item + 2 + buf[item + 1]
            key = buf[item + 2:key_end]
        else:
            key_end, key = skip_value(buf, item), None
        if key == _SEQ_KEY:
            seq = _integer(buf, key_end)
        elif key == _SENT_KEY:
            sent_ns = _integer(buf, key_end)
        item = skip_value(buf, key_end)
    return seq, sent_ns


def read_fields(buf: bytes) -> tuple[str | None, int, int]:
    """(group id, bench_seq, bench_sent_ns) of an encoded message; -1 and 0 for what is missing."""
    group, seq, sent_ns = None, -1, 0
    position, end = 0, len(buf)
    while position < end:
        if buf[position] != 0x00 or buf[position + 1] != 0x53:
            raise ValueError(f"byte {position} does not start a section with a small descriptor")
        section = buf[position + 2]
        position += 3
        if section >= _FIRST_BODY_SECTION:
            break
        if section == _PROPERTIES:
            group, position = _group_id(buf, position)
        elif section == _APPLICATION_PROPERTIES:
            seq, sent_ns = _bench_properties(buf, position)
            break  # the body follows
        else:
            position = skip_value(buf, position)
    return group, seq, sent_ns
