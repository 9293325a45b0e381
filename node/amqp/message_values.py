"""AMQP values read in place, typed as a JMS selector sees them: what node/amqp/message_fields.py reads with.

Rules:
- Nothing is decoded beyond what a caller asks for: `extent` steps over a value (type_encoding's walk,
  which loops over described values however deep a sender nests them), `read_value` reads one.
- Strings and symbols are str, every integer type (and timestamps, in ms) int, float and double float,
  booleans bool, binary bytes, uuid a UUID; lists, maps, arrays, decimals and described values are
  OPAQUE: present, but unlike anything a selector can compare with.
- Bytes that cannot be read (truncated, an unknown format code, a string that is not UTF-8) raise
  Unreadable (or IndexError, ValueError, struct.error from the reading itself): the caller treats what
  it was reading as absent.
"""

from __future__ import annotations

import struct
import uuid

from node.amqp.type_encoding import FIXED_WIDTH_BYTES, Malformed, skip_value

_FLOAT, _DOUBLE = struct.Struct(">f"), struct.Struct(">d")


class _Opaque:
    """A value of a type JMS has no name for: present, equal to nothing a selector can write."""

    def __repr__(self) -> str:
        return "OPAQUE"


OPAQUE = _Opaque()


class Unreadable(ValueError):
    """Bytes these rules cannot read: the section in question counts as absent."""


def extent(buf: bytes, position: int) -> int:
    """The position just past the value at `position`, nothing decoded (type_encoding's walk, which loops
    over described values however deep the sender nests them); unreadable or truncated bytes raise."""
    try:
        end = skip_value(buf, position)
    except (Malformed, IndexError) as error:
        raise Unreadable(str(error) or "truncated") from None
    if end > len(buf):
        raise Unreadable("truncated")
    return end


def _integer(buf: bytes, position: int, width: int, signed: bool) -> int:
    return int.from_bytes(buf[position:position + width], "big", signed=signed)


_SCALARS = {  # format code -> reader of its bytes (the code already passed)
    0x40: lambda buf, at: None, 0x41: lambda buf, at: True, 0x42: lambda buf, at: False,
    0x56: lambda buf, at: buf[at] != 0, 0x43: lambda buf, at: 0, 0x44: lambda buf, at: 0,
    0x50: lambda buf, at: buf[at], 0x52: lambda buf, at: buf[at], 0x53: lambda buf, at: buf[at],
    0x51: lambda buf, at: _integer(buf, at, 1, True), 0x54: lambda buf, at: _integer(buf, at, 1, True),
    0x55: lambda buf, at: _integer(buf, at, 1, True),
    0x60: lambda buf, at: _integer(buf, at, 2, False), 0x61: lambda buf, at: _integer(buf, at, 2, True),
    0x70: lambda buf, at: _integer(buf, at, 4, False), 0x71: lambda buf, at: _integer(buf, at, 4, True),
    0x80: lambda buf, at: _integer(buf, at, 8, False), 0x81: lambda buf, at: _integer(buf, at, 8, True),
    0x83: lambda buf, at: _integer(buf, at, 8, True),  # timestamp, ms since the epoch
    0x72: lambda buf, at: _FLOAT.unpack_from(buf, at)[0], 0x82: lambda buf, at: _DOUBLE.unpack_from(buf, at)[0],
    0x73: lambda buf, at: chr(_integer(buf, at, 4, False)),  # char, UTF-32
    0x98: lambda buf, at: uuid.UUID(bytes=bytes(buf[at:at + 16])),
}
_STRINGS = frozenset({0xA1, 0xB1, 0xA3, 0xB3})  # str8, str32, sym8, sym32
_BINARIES = frozenset({0xA0, 0xB0})


def read_value(buf: bytes, position: int) -> tuple:
    """(value, end) of the value at `position`, typed as the module's rules say."""
    code = buf[position]
    if code == 0xA1 or code == 0xA3:  # str8 and sym8 first: most keys and string values are
        end = position + 2 + buf[position + 1]
        if end > len(buf):
            raise Unreadable("truncated")
        return bytes(buf[position + 2:end]).decode("utf-8"), end
    reader = _SCALARS.get(code)
    if reader is not None:
        end = position + 1 + FIXED_WIDTH_BYTES[code >> 4]
        if end > len(buf):
            raise Unreadable("truncated")
        return reader(buf, position + 1), end
    end = extent(buf, position)
    if code in _STRINGS or code in _BINARIES:
        content = bytes(buf[position + (2 if code < 0xB0 else 5):end])
        return (content.decode("utf-8") if code in _STRINGS else content), end
    return OPAQUE, end


def compound(buf: bytes, position: int) -> tuple[int, int, int]:
    """A list or map: (count of items, position of the first item, end)."""
    code = buf[position]
    end = extent(buf, position)
    if code == 0x45:  # list0
        return 0, end, end
    if code in (0xC0, 0xC1):
        return buf[position + 2], position + 3, end
    if code in (0xD0, 0xD1):
        return _integer(buf, position + 5, 4, False), position + 9, end
    raise Unreadable(f"a section of format code 0x{code:02x}, not a list or a map")


def list_items(buf: bytes, position: int, wanted: int) -> list:
    count, item, end = compound(buf, position)
    items = []
    for _ in range(min(count, wanted)):
        value, item = read_value(buf, item)
        if item > end:
            raise Unreadable("a list item runs past its list")
        items.append(value)
    return items + [None] * (wanted - len(items))


def map_entries(buf: bytes, position: int):
    """(key, value) pairs of the map at `position`; keys of other types than strings are passed over."""
    count, item, end = compound(buf, position)
    for _ in range(count // 2):
        key, item = read_value(buf, item)
        value, item = read_value(buf, item)
        if item > end:
            raise Unreadable("a map entry runs past its map")
        if isinstance(key, str):
            yield key, value


def map_positions(buf: bytes, position: int) -> dict:
    """String key -> position of its value, for the map at `position`; values are stepped over, not read."""
    count, item, end = compound(buf, position)
    positions = {}
    for _ in range(count // 2):
        key, item = read_value(buf, item)
        value_at, item = item, extent(buf, item)
        if item > end:
            raise Unreadable("a map entry runs past its map")
        if isinstance(key, str):
            positions.setdefault(key, value_at)
    return positions
