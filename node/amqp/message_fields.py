"""What a JMS selector reads of a message, straight from the AMQP bytes the node stores: a lazy mapping.

Rules:
- `MessageFields(payload)` is a read-only mapping from selector identifiers to values: application
  properties by their own names, and the JMS names node.core.dispatch.selector's header lists (JMSXGroupID,
  JMSPriority, JMSType ...) from the header, properties and message-annotations sections, by the AMQP
  JMS mapping (Qpid JMS's). `get(name)` gives None for an absent field: the selector's NULL.
- Lazy: nothing is read at construction. The first lookup walks the section boundaries once (sizes
  only, up to the body, which is never read); each section is decoded on the first lookup that needs
  it, and kept, so one message tried against many consumers' selectors is decoded once.
- A section that cannot be read (truncated, an unknown format code, a string that is not UTF-8) is
  treated as absent, and so is everything after a broken boundary: its fields are NULL, and nothing
  raises into dispatch. The send was checked already (node.amqp.codec refuses what is not AMQP).
- Values keep JMS's types: strings and symbols are str, every integer type (and timestamps, in ms) is
  int, float and double are float, booleans bool. Lists, maps, arrays, decimals and described values
  are OPAQUE, binary is bytes and uuid a UUID: present (IS NOT NULL) but unlike anything a selector
  can compare with.
- No proton: a full decode costs far more than the few fields a selector asks for.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Mapping

from node.amqp.type_encoding import FIXED_WIDTH_BYTES, Malformed, skip_value

_HEADER, _MESSAGE_ANNOTATIONS, _PROPERTIES, _APPLICATION_PROPERTIES = 0x70, 0x72, 0x73, 0x74
_FIRST_BODY_SECTION = 0x75
_SECTION_NAMES = {"amqp:header:list": 0x70, "amqp:delivery-annotations:map": 0x71,
                  "amqp:message-annotations:map": 0x72, "amqp:properties:list": 0x73,
                  "amqp:application-properties:map": 0x74, "amqp:data:binary": 0x75,
                  "amqp:amqp-sequence:list": 0x76, "amqp:amqp-value:*": 0x77, "amqp:footer:map": 0x78}
JMS_TYPE_ANNOTATION = "x-opt-jms-type"  # where Qpid JMS puts JMSType
DEFAULT_PRIORITY = 4  # AMQP's header.priority when absent (and JMS's default)
_HEADER_ITEMS, _PROPERTIES_ITEMS = 2, 12  # durable, priority; message-id ... group-sequence
_FLOAT, _DOUBLE = struct.Struct(">f"), struct.Struct(">d")


class _Opaque:
    """A value of a type JMS has no name for: present, equal to nothing a selector can write."""

    def __repr__(self) -> str:
        return "OPAQUE"


OPAQUE = _Opaque()


class _Unreadable(ValueError):
    """Bytes these rules cannot read: the section in question counts as absent."""


def _extent(buf: bytes, position: int) -> int:
    """The position just past the value at `position`, nothing decoded (type_encoding's walk, which loops
    over described values however deep the sender nests them); unreadable or truncated bytes raise."""
    try:
        end = skip_value(buf, position)
    except (Malformed, IndexError) as error:
        raise _Unreadable(str(error) or "truncated") from None
    if end > len(buf):
        raise _Unreadable("truncated")
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
            raise _Unreadable("truncated")
        return bytes(buf[position + 2:end]).decode("utf-8"), end
    reader = _SCALARS.get(code)
    if reader is not None:
        end = position + 1 + FIXED_WIDTH_BYTES[code >> 4]
        if end > len(buf):
            raise _Unreadable("truncated")
        return reader(buf, position + 1), end
    end = _extent(buf, position)
    if code in _STRINGS or code in _BINARIES:
        content = bytes(buf[position + (2 if code < 0xB0 else 5):end])
        return (content.decode("utf-8") if code in _STRINGS else content), end
    return OPAQUE, end


def _compound(buf: bytes, position: int) -> tuple[int, int, int]:
    """A list or map: (count of items, position of the first item, end)."""
    code = buf[position]
    end = _extent(buf, position)
    if code == 0x45:  # list0
        return 0, end, end
    if code in (0xC0, 0xC1):
        return buf[position + 2], position + 3, end
    if code in (0xD0, 0xD1):
        return _integer(buf, position + 5, 4, False), position + 9, end
    raise _Unreadable(f"a section of format code 0x{code:02x}, not a list or a map")


def _list_items(buf: bytes, position: int, wanted: int) -> list:
    count, item, end = _compound(buf, position)
    items = []
    for _ in range(min(count, wanted)):
        value, item = read_value(buf, item)
        if item > end:
            raise _Unreadable("a list item runs past its list")
        items.append(value)
    return items + [None] * (wanted - len(items))


def _map_entries(buf: bytes, position: int):
    """(key, value) pairs of the map at `position`; keys of other types than strings are passed over."""
    count, item, end = _compound(buf, position)
    for _ in range(count // 2):
        key, item = read_value(buf, item)
        value, item = read_value(buf, item)
        if item > end:
            raise _Unreadable("a map entry runs past its map")
        if isinstance(key, str):
            yield key, value


def _section_starts(buf: bytes) -> dict[int, int]:
    """Section code -> position of its value, for the sections before the body; stops where it cannot read."""
    starts, position, end = {}, 0, len(buf)
    try:
        while position < end:
            if buf[position] != 0x00:
                break
            descriptor, value_at = read_value(buf, position + 1)
            section = _SECTION_NAMES.get(descriptor) if isinstance(descriptor, str) else descriptor
            if not isinstance(section, int) or section >= _FIRST_BODY_SECTION:
                break
            starts.setdefault(section, value_at)
            position = _extent(buf, value_at)
    except (IndexError, ValueError, struct.error):
        pass  # what was found before the break stands
    return starts


def jms_id(value):
    """A message-id or correlation-id as Qpid JMS shows it to a selector: strings as they are."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return f"ID:AMQP_ULONG:{value}"
    if isinstance(value, uuid.UUID):
        return f"ID:AMQP_UUID:{value}"
    if isinstance(value, bytes):
        return "ID:AMQP_BINARY:" + value.hex().upper()
    return None


class MessageFields(Mapping):
    """The selector's view of one message (the rules above); build one per message, share it across selectors."""

    __slots__ = ("_payload", "_starts", "_header", "_properties", "_application", "_jms_type")

    def __init__(self, payload: bytes):
        self._payload = payload
        self._starts = self._header = self._properties = self._application = None
        self._jms_type = ...  # not read yet (None is a read annotation that is absent)

    def get(self, name: str, default=None):
        reader = _JMS_FIELDS.get(name)
        value = reader(self) if reader is not None else self._application_properties().get(name)
        return default if value is None else value

    def __getitem__(self, name: str):
        value = self.get(name)
        if value is None:
            raise KeyError(name)
        return value

    def __iter__(self):
        names = [name for name, reader in _JMS_FIELDS.items() if reader(self) is not None]
        names += [name for name in self._application_properties() if name not in _JMS_FIELDS]
        return iter(names)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    # ---- sections, each read once --------------------------------------------------------

    def _section(self, section: int) -> int | None:
        if self._starts is None:
            self._starts = _section_starts(self._payload)
        return self._starts.get(section)

    def _list(self, section: int, wanted: int) -> list:
        position = self._section(section)
        if position is None:
            return [None] * wanted
        try:
            return _list_items(self._payload, position, wanted)
        except (IndexError, ValueError, struct.error):
            return [None] * wanted

    def _header_items(self) -> list:
        if self._header is None:
            self._header = self._list(_HEADER, _HEADER_ITEMS)
        return self._header

    def _properties_items(self) -> list:
        if self._properties is None:
            self._properties = self._list(_PROPERTIES, _PROPERTIES_ITEMS)
        return self._properties

    def _application_properties(self) -> dict:
        if self._application is None:
            self._application = self._map(_APPLICATION_PROPERTIES, lambda key: True)
        return self._application

    def _map(self, section: int, wanted) -> dict:
        position = self._section(section)
        if position is None:
            return {}
        try:
            return {key: value for key, value in _map_entries(self._payload, position) if wanted(key)}
        except (IndexError, ValueError, struct.error):
            return {}

    # ---- the JMS names --------------------------------------------------------------------

    def _property_or_application(self, index: int, name: str):
        value = self._properties_items()[index]
        return value if value is not None else self._application_properties().get(name)

    def _jms_type_value(self):
        if self._jms_type is ...:
            annotations = self._map(_MESSAGE_ANNOTATIONS, lambda key: key == JMS_TYPE_ANNOTATION)
            self._jms_type = annotations.get(JMS_TYPE_ANNOTATION)
        value = self._jms_type if self._jms_type is not None else self._properties_items()[3]
        return value if value is not None else self._application_properties().get("JMSType")

    def _priority(self):
        value = self._header_items()[1]
        return DEFAULT_PRIORITY if value is None else value

    def _delivery_mode(self) -> str:
        return "PERSISTENT" if self._header_items()[0] is True else "NON_PERSISTENT"

    def _time(self, index: int) -> int:
        value = self._properties_items()[index]
        return value if isinstance(value, int) and not isinstance(value, bool) else 0


_JMS_FIELDS = {
    "JMSXGroupID": lambda fields: fields._property_or_application(10, "JMSXGroupID"),
    "JMSXGroupSeq": lambda fields: fields._property_or_application(11, "JMSXGroupSeq"),
    "JMSMessageID": lambda fields: jms_id(fields._property_or_application(0, "JMSMessageID")),
    "JMSCorrelationID": lambda fields: jms_id(fields._property_or_application(5, "JMSCorrelationID")),
    "JMSType": MessageFields._jms_type_value,
    "JMSPriority": MessageFields._priority,
    "JMSDeliveryMode": MessageFields._delivery_mode,
    "JMSTimestamp": lambda fields: fields._time(9),
    "JMSExpiration": lambda fields: fields._time(8),
}



DUPLICATE_ID_PROPERTY = "_AMQ_DUPL_ID"  # issue 31: Artemis's duplicate-detection property, before message-id


def dedup_id(payload: bytes) -> str | None:
    """Issue 31: the id a de-duplicating queue remembers (node/core/dispatch/dedup.py): `_AMQ_DUPL_ID` when it
    holds a string, binary or integer, else properties.message-id, as `jms_id` spells them; None: neither.
    Only those two sections are read, as MessageFields reads them (an unreadable one is absent)."""
    fields = MessageFields(payload)
    wanted = fields._map(_APPLICATION_PROPERTIES, lambda key: key == DUPLICATE_ID_PROPERTY)
    found = jms_id(wanted.get(DUPLICATE_ID_PROPERTY))
    return found if found is not None else jms_id(fields._list(_PROPERTIES, 1)[0])
