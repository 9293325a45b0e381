"""The AMQP 1.0 type encoding (part 1.6), walked in place: a value's extent, and the few types
dispatch reads (null, strings and symbols, integers, booleans, lists' and maps' headers).

Rules:
- Pure and on the per-message hot path: bytes and positions in, values and positions out; nothing is
  copied but the values read, and nothing is decoded that only has to be skipped.
- Two failures, for node/amqp/codec.py to tell apart: `Unreadable` for valid AMQP these functions do
  not read (proton's decoder takes over), `Malformed` (a ValueError) for bytes that are no AMQP at all.
  Truncated input raises IndexError or ValueError, as the callers expect.
"""

from __future__ import annotations

FIXED_WIDTH_BYTES = {0x4: 0, 0x5: 1, 0x6: 2, 0x7: 4, 0x8: 8, 0x9: 16}  # by the format code's high nibble


class Unreadable(Exception):
    """Valid AMQP the scanner does not read itself: proton's decoder takes over."""


class Malformed(ValueError):
    """Not an AMQP 1.0 message at all."""


def list_items(buf: bytes, position: int, count_needed: int) -> tuple[list, int]:
    """Read the first `count_needed` items of a list; returns them (None-padded) and the end."""
    if buf[position] == 0x45:  # list0
        return [None] * count_needed, position + 1
    end, count, position = compound(buf, position, 0xC0, 0xD0, "a header or properties section that is not a list")
    items = []
    for _ in range(min(count, count_needed)):
        value, position = read_value(buf, position)
        items.append(value)
    items.extend([None] * (count_needed - len(items)))
    return items, end


def map_values(buf: bytes, position: int, wanted_keys: dict) -> tuple[list, int]:
    """The values of the keys `wanted_keys` maps to slots 0..2 (None where absent), and the map's end."""
    end, count, position = compound(buf, position, 0xC1, 0xD1, "an application-properties section that is not a map")
    found = [None, None, None]
    for _ in range(count // 2):
        key, position = read_value(buf, position)
        slot = wanted_keys.get(key)
        if slot is None:
            position = skip_value(buf, position)
        else:
            found[slot], position = read_value(buf, position)
            if found[slot] is ...:
                raise Unreadable(f"application property {key!r} of a type the scanner does not read")
    return found, end


def compound(buf: bytes, position: int, code8: int, code32: int, problem: str) -> tuple[int, int, int]:
    """A list or map header: returns (end of the value, item count, position of the first item)."""
    code = buf[position]
    if code == code8:
        return position + 2 + buf[position + 1], buf[position + 2], position + 3
    if code == code32:
        size = int.from_bytes(buf[position + 1:position + 5], "big")
        return position + 5 + size, int.from_bytes(buf[position + 5:position + 9], "big"), position + 9
    raise Malformed(problem)


def read_value(buf: bytes, position: int):
    """Read one value of the types these fields use; anything else is skipped as `...`."""
    code = buf[position]
    position += 1
    if code == 0x40:
        return None, position
    if code in (0xA1, 0xA3):
        length = buf[position]
        return buf[position + 1:position + 1 + length].decode("utf-8"), position + 1 + length
    if code in (0xB1, 0xB3):
        length = int.from_bytes(buf[position:position + 4], "big")
        return buf[position + 4:position + 4 + length].decode("utf-8"), position + 4 + length
    if code in (0x43, 0x44):
        return 0, position
    if code in (0x52, 0x53, 0x50):
        return buf[position], position + 1
    if code in (0x54, 0x55, 0x51):
        return int.from_bytes(buf[position:position + 1], "big", signed=True), position + 1
    if code == 0x70:
        return int.from_bytes(buf[position:position + 4], "big"), position + 4
    if code == 0x71:
        return int.from_bytes(buf[position:position + 4], "big", signed=True), position + 4
    if code in (0x80, 0x83):
        return int.from_bytes(buf[position:position + 8], "big"), position + 8
    if code == 0x81:
        return int.from_bytes(buf[position:position + 8], "big", signed=True), position + 8
    if code == 0x60:
        return int.from_bytes(buf[position:position + 2], "big"), position + 2
    if code == 0x61:
        return int.from_bytes(buf[position:position + 2], "big", signed=True), position + 2
    if code in (0x41, 0x42):
        return code == 0x41, position
    if code == 0x56:
        return buf[position] == 1, position + 1
    return ..., skip_value(buf, position - 1)  # a type dispatch never compares: only its extent matters


def skip_value(buf: bytes, position: int) -> int:
    """The position just past the AMQP-encoded value at `position` (its extent only; nothing is decoded).

    A loop, not a recursion: a described value (0x00) is a descriptor and then a value, so each 0x00 adds
    one value still to skip. Nested descriptions cost a count, never a stack frame, so a sender cannot
    exhaust the stack with thousands of 0x00 bytes (that was a RecursionError, which escaped dispatch)."""
    pending = 1  # values still to skip
    while True:
        code = buf[position]
        position += 1
        if code == 0x00:
            pending += 1
            continue
        high = code >> 4
        width = FIXED_WIDTH_BYTES.get(high)
        if width is not None:
            position += width
        elif high in (0xA, 0xC, 0xE):
            position += 1 + buf[position]
        elif high in (0xB, 0xD, 0xF):
            position += 4 + int.from_bytes(buf[position:position + 4], "big")
        else:
            raise Malformed(f"unknown format code 0x{code:02x}")
        pending -= 1
        if not pending:
            return position
