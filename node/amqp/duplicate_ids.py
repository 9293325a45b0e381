"""The de-duplication id of a send (issue 31, node/core/dispatch/dedup.py), read fast from the AMQP bytes.

Rules:
- `dedup_id(payload)` answers exactly as node.amqp.message_fields.dedup_id (the reference reader, which
  tests/unit/test_dedup.py checks it against): `_AMQ_DUPL_ID` when present, else properties.message-id,
  spelled as message_fields.jms_id spells them; None when neither.
- On the per-message path of a de-duplicating queue: a payload that holds the bytes of `_AMQ_DUPL_ID`
  nowhere (nearly all) never has its application properties read; the sections before properties are
  skipped by their extent; a string message-id in a list8 is sliced out. Anything else (a property
  that may be there, a described section named by symbol, other id types, bytes that do not read) goes
  to the reference reader, which treats what it cannot read as absent. Never raises.
"""

from __future__ import annotations

from node.amqp import message_fields
from node.amqp.type_encoding import skip_value

_DUPLICATE_ID_BYTES = message_fields.DUPLICATE_ID_PROPERTY.encode()
_SMALL_ULONG, _PROPERTIES, _FIRST_BODY_SECTION = 0x53, 0x73, 0x75
_LIST8, _STR8 = 0xC0, 0xA1


def dedup_id(payload: bytes) -> str | None:
    if _DUPLICATE_ID_BYTES in payload:  # the property may be there: the reference reader decides
        return message_fields.dedup_id(payload)
    try:
        position, end = 0, len(payload)
        while position + 3 < end and payload[position] == 0 and payload[position + 1] == _SMALL_ULONG:
            section = payload[position + 2]
            if section == _PROPERTIES:
                at = position + 3
                if payload[at] == _LIST8 and payload[at + 2] and payload[at + 3] == _STR8:
                    length = payload[at + 4]
                    if at + 5 + length <= end:
                        return payload[at + 5:at + 5 + length].decode("utf-8")
                break  # another layout or id type: the reference reader
            if section >= _FIRST_BODY_SECTION:
                return None  # the body came first: no properties section
            position = skip_value(payload, position + 3)
    except (IndexError, ValueError):
        pass  # the reference reader treats what it cannot read as absent
    return message_fields.dedup_id(payload)
