"""What a JMS selector reads of a message, straight from the AMQP bytes the node stores: a lazy mapping.

Rules:
- `MessageFields(payload)` is a read-only mapping from selector identifiers to values: application
  properties by their own names, and the JMS names node.core.dispatch.selector's header lists (JMSXGroupID,
  JMSPriority, JMSType ...) from the header, properties and message-annotations sections, by the AMQP
  JMS mapping (Qpid JMS's). `get(name)` gives None for an absent field: the selector's NULL.
- Lazy: nothing is read at construction. The first lookup walks the section boundaries once (sizes
  only, up to the body, which is never read); each section is decoded on the first lookup that needs
  it, and kept, so one message tried against many consumers' selectors is decoded once. Application
  properties are indexed (keys read, values only stepped over) on the first lookup of one, and a
  value is decoded only when a selector names it: a selector reading `colour` of a message with
  twenty properties decodes one value.
- A section that cannot be read (truncated, an unknown format code, a key that is not UTF-8) is
  treated as absent, and so is everything after a broken boundary: its fields are NULL, and nothing
  raises into dispatch. An application property whose value cannot be read (a string that is not
  UTF-8) is absent alone. The send was checked already (node.amqp.codec refuses what is not AMQP).
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

from node.amqp.message_values import OPAQUE, extent, list_items, map_entries, map_positions, read_value

__all__ = ["OPAQUE", "MessageFields", "jms_id"]  # OPAQUE: what a value of a type JMS has no name for reads as

_HEADER, _MESSAGE_ANNOTATIONS, _PROPERTIES, _APPLICATION_PROPERTIES = 0x70, 0x72, 0x73, 0x74
_FIRST_BODY_SECTION = 0x75
_SECTION_NAMES = {"amqp:header:list": 0x70, "amqp:delivery-annotations:map": 0x71,
                  "amqp:message-annotations:map": 0x72, "amqp:properties:list": 0x73,
                  "amqp:application-properties:map": 0x74, "amqp:data:binary": 0x75,
                  "amqp:amqp-sequence:list": 0x76, "amqp:amqp-value:*": 0x77, "amqp:footer:map": 0x78}
JMS_TYPE_ANNOTATION = "x-opt-jms-type"  # where Qpid JMS puts JMSType
DEFAULT_PRIORITY = 4  # AMQP's header.priority when absent (and JMS's default)
_HEADER_ITEMS, _PROPERTIES_ITEMS = 2, 12  # durable, priority; message-id ... group-sequence


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
            position = extent(buf, value_at)
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

    __slots__ = ("_payload", "_starts", "_header", "_properties", "_application", "_application_at", "_jms_type")

    def __init__(self, payload: bytes):
        self._payload = payload
        self._starts = self._header = self._properties = self._application_at = None
        self._application: dict = {}  # name -> decoded value (None: absent), for the names asked so far
        self._jms_type = ...  # not read yet (None is a read annotation that is absent)

    def get(self, name: str, default=None):
        reader = _JMS_FIELDS.get(name)
        value = reader(self) if reader is not None else self._application_value(name)
        return default if value is None else value

    def __getitem__(self, name: str):
        value = self.get(name)
        if value is None:
            raise KeyError(name)
        return value

    def __iter__(self):
        names = [name for name, reader in _JMS_FIELDS.items() if reader(self) is not None]
        names += [name for name in self._application_positions()
                  if name not in _JMS_FIELDS and self._application_value(name) is not None]
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
            return list_items(self._payload, position, wanted)
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

    def _application_positions(self) -> dict:
        if self._application_at is None:
            position = self._section(_APPLICATION_PROPERTIES)
            try:
                self._application_at = {} if position is None else map_positions(self._payload, position)
            except (IndexError, ValueError, struct.error):
                self._application_at = {}
        return self._application_at

    def _application_value(self, name: str):
        values = self._application
        if name in values:
            return values[name]
        position = self._application_positions().get(name)
        value = None
        if position is not None:
            try:
                value = read_value(self._payload, position)[0]
            except (IndexError, ValueError, struct.error):
                value = None  # this value alone cannot be read: it is absent
        values[name] = value
        return value

    def _map(self, section: int, wanted) -> dict:
        position = self._section(section)
        if position is None:
            return {}
        try:
            return {key: value for key, value in map_entries(self._payload, position) if wanted(key)}
        except (IndexError, ValueError, struct.error):
            return {}

    # ---- the JMS names --------------------------------------------------------------------

    def _property_or_application(self, index: int, name: str):
        value = self._properties_items()[index]
        return value if value is not None else self._application_value(name)

    def _jms_type_value(self):
        if self._jms_type is ...:
            annotations = self._map(_MESSAGE_ANNOTATIONS, lambda key: key == JMS_TYPE_ANNOTATION)
            self._jms_type = annotations.get(JMS_TYPE_ANNOTATION)
        value = self._jms_type if self._jms_type is not None else self._properties_items()[3]
        return value if value is not None else self._application_value("JMSType")

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
