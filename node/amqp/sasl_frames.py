"""The few AMQP 1.0 types a SASL exchange uses (part 5.3): its frames, read and written.

Rules:
- Pure: bytes in, values out, and back. Decoding reads only inside the frame body it is given and
  fails only with SaslError (code 2: the client broke the protocol; 1: bad text in credentials).
- Frames are cut from the exchange's buffer only once whole; a frame's size is checked against the
  limit before any more of it is waited for.
"""

from __future__ import annotations

OUTCOME_OK, OUTCOME_AUTH, OUTCOME_SYS, OUTCOME_SYS_PERM, OUTCOME_SYS_TEMP = 0, 1, 2, 3, 4
FRAME_HEADER_BYTES = 8
SASL_FRAME_TYPE = 0x01
MECHANISMS, INIT, CHALLENGE, RESPONSE, OUTCOME = 0x40, 0x41, 0x42, 0x43, 0x44
PERFORMATIVE_BY_NAME = {b"amqp:sasl-mechanisms:list": MECHANISMS, b"amqp:sasl-init:list": INIT,
                        b"amqp:sasl-challenge:list": CHALLENGE, b"amqp:sasl-response:list": RESPONSE,
                        b"amqp:sasl-outcome:list": OUTCOME}
USER_SHOWN_CHARS_MAX = 64  # a user name longer than this is cut in failure reasons


class SaslError(Exception):
    """The exchange cannot go on. `code` is the sasl-outcome code; `fault` is "client" or "node"."""

    def __init__(self, code: int, description: str, fault: str = "client"):
        super().__init__(description)
        self.code, self.description, self.fault = code, description, fault


def shown(user: str | None) -> str:
    """A claimed user name as failure reasons show it: quoted, and cut after USER_SHOWN_CHARS_MAX."""
    return repr(user if user is None or len(user) <= USER_SHOWN_CHARS_MAX else user[:USER_SHOWN_CHARS_MAX] + "...")


class Fields:
    """The fields of one performative's list, read lazily and only inside the frame body."""

    def __init__(self, body: bytes, position: int, end: int, count: int):
        self.values = []
        for _ in range(min(count, 3)):  # no SASL performative the server reads has more than 3 fields
            code, start, value_end = value_extent(body, position, end)
            self.values.append((code, body[start:value_end]))
            position = value_end

    def _field(self, index: int, name: str, codes: tuple, kind: str, mandatory: bool):
        code, value = self.values[index] if index < len(self.values) else (0x40, b"")
        if code == 0x40:
            if mandatory:
                raise SaslError(OUTCOME_SYS, f"the client left out the mandatory field {name}: a client bug")
            return None
        if code not in codes:
            raise SaslError(OUTCOME_SYS, f"the client sent field {name} as type 0x{code:02x}, not {kind}: a client bug")
        return value

    def symbol(self, index: int, name: str, mandatory: bool = False) -> str | None:
        value = self._field(index, name, (0xA3, 0xB3), "a symbol", mandatory)
        return None if value is None else text(value, name, "ascii")

    def binary(self, index: int, name: str, mandatory: bool = False) -> bytes | None:
        return self._field(index, name, (0xA0, 0xB0), "binary", mandatory)


def next_frame(buffer: bytearray, position: int, frame_max_bytes: int) -> tuple[int, bytes]:
    """(its size, its body) of the frame at `position` once it is whole, (0, b"") until then. A frame
    announced over `frame_max_bytes` fails as soon as its 4 size bytes are in."""
    available = len(buffer) - position
    if available < 4:
        return 0, b""
    size_bytes = bytes(buffer[position:position + 4])
    if size_bytes == b"AMQP":
        raise SaslError(OUTCOME_SYS, "the client sent its AMQP header before the SASL exchange had an outcome: "
                                     "a client bug")
    size = int.from_bytes(size_bytes, "big")
    if size > frame_max_bytes:
        raise SaslError(OUTCOME_SYS, f"the client sent a SASL frame of {size} bytes, over the limit of "
                                     f"{frame_max_bytes} bytes before authentication (frame_max_bytes)")
    if size < FRAME_HEADER_BYTES:
        raise SaslError(OUTCOME_SYS, f"the client sent a malformed frame (size {size} bytes)")
    if available < size:
        return 0, b""
    data_offset_bytes, frame_type = buffer[position + 4] * 4, buffer[position + 5]
    if data_offset_bytes < FRAME_HEADER_BYTES or data_offset_bytes > size:
        raise SaslError(OUTCOME_SYS, f"the client sent a malformed frame (data offset {data_offset_bytes} bytes)")
    if frame_type != SASL_FRAME_TYPE:
        raise SaslError(OUTCOME_SYS, f"the client sent a frame of type {frame_type} during the SASL exchange")
    return size, bytes(buffer[position + data_offset_bytes:position + size])


def decode_performative(body: bytes) -> tuple[int, Fields]:
    end = len(body)
    if body[0] != 0x00:
        raise SaslError(OUTCOME_SYS, "the client sent a SASL frame whose body is not a described list: a client bug")
    code, start, value_end = value_extent(body, 1, end)
    descriptor = body[start:value_end]
    if code in (0x53, 0x80):
        performative = int.from_bytes(descriptor, "big")
    elif code in (0xA3, 0xB3):
        performative = PERFORMATIVE_BY_NAME.get(descriptor, -1)
    else:
        raise SaslError(OUTCOME_SYS, f"the client sent a performative descriptor of type 0x{code:02x}: a client bug")
    list_code, list_start, list_end = value_extent(body, value_end, end)
    if list_code == 0x45:
        return performative, Fields(body, list_start, list_end, 0)
    if list_code not in (0xC0, 0xD0):
        raise SaslError(OUTCOME_SYS, "the client sent a performative that is not a list: a client bug")
    count_bytes = 1 if list_code == 0xC0 else 4
    if list_end - list_start < count_bytes:
        raise SaslError(OUTCOME_SYS, "the client sent a truncated list: a client bug")
    count = int.from_bytes(body[list_start:list_start + count_bytes], "big")
    return performative, Fields(body, list_start + count_bytes, list_end, count)


_WIDTH_BYTES = {0x40: 0, 0x45: 0, 0x50: 1, 0x53: 1, 0x80: 8}  # null, list0, ubyte, smallulong, ulong
_SIZED = {0xA0: 1, 0xA1: 1, 0xA3: 1, 0xC0: 1, 0xE0: 1, 0xB0: 4, 0xB1: 4, 0xB3: 4, 0xD0: 4, 0xF0: 4}


def value_extent(body: bytes, position: int, end: int) -> tuple[int, int, int]:
    """(format code, start of its content, end of the value), all checked to lie before `end`."""
    if position >= end:
        raise SaslError(OUTCOME_SYS, "the client sent a truncated SASL frame body: a client bug")
    code = body[position]
    position += 1
    if code in _WIDTH_BYTES:
        value_end = position + _WIDTH_BYTES[code]
    elif code in _SIZED:
        size_bytes = _SIZED[code]
        if position + size_bytes > end:
            raise SaslError(OUTCOME_SYS, "the client sent a truncated SASL frame body: a client bug")
        size = int.from_bytes(body[position:position + size_bytes], "big")
        position += size_bytes
        value_end = position + size
    else:
        raise SaslError(OUTCOME_SYS, f"the client sent AMQP type 0x{code:02x} where SASL has none: a client bug")
    if value_end > end:
        raise SaslError(OUTCOME_SYS, "the client sent a value that runs past its SASL frame: a client bug")
    return code, position, value_end


def text(value: bytes, name: str, encoding: str = "utf-8") -> str:
    try:
        return value.decode(encoding)
    except UnicodeDecodeError:
        raise SaslError(OUTCOME_AUTH, f"the client's {name} is not valid {encoding}") from None


def frame(body: bytes) -> bytes:
    return (FRAME_HEADER_BYTES + len(body)).to_bytes(4, "big") + bytes((2, SASL_FRAME_TYPE, 0, 0)) + body


def performative(code: int, fields: bytes, count: int = 1) -> bytes:
    return bytes((0x00, 0x53, code)) + sized(0xC0, 0xD0, count.to_bytes(1, "big"), count.to_bytes(4, "big"), fields)


def sized(code8: int, code32: int, count8: bytes, count32: bytes, content: bytes) -> bytes:
    if len(count8 + content) <= 255:
        return bytes((code8, len(count8 + content))) + count8 + content
    return bytes((code32,)) + len(count32 + content).to_bytes(4, "big") + count32 + content


def symbol_array(names: tuple[str, ...]) -> bytes:
    """array8 of sym8: the supported mechanisms' names are short and few."""
    elements = b"".join(bytes((len(name),)) + name.encode("ascii") for name in names)
    return bytes((0xE0, 2 + len(elements), len(names), 0xA3)) + elements


def binary(value: bytes) -> bytes:
    if len(value) <= 255:
        return bytes((0xA0, len(value))) + value
    return b"\xb0" + len(value).to_bytes(4, "big") + value


def ubyte(value: int) -> bytes:
    return bytes((0x50, value))
