"""The de-duplication id of a send (issue 31, node/core/dispatch/dedup.py), read fast from the AMQP bytes.

Rules:
- `dedup_id(payload)` answers exactly as node.amqp.message_fields.dedup_id (the reference reader, which
  tests/unit/test_dedup.py checks it against): `_AMQ_DUPL_ID` when present, else properties.message-id,
  spelled as message_fields.jms_id spells them; None when neither.
- On the per-message path of a de-duplicating queue: the sections before the body are walked by their
  extent (the body is never scanned, however large); a string message-id in a list8 is sliced out; an
  application-properties section is only searched for the bytes of `_AMQ_DUPL_ID`. Anything else (a
  property that may be there, a section named by symbol, other id types, bytes that do not read, no
  body) goes to the reference reader, which treats what it cannot read as absent. Never raises.
"""

from __future__ import annotations

from node.amqp import message_fields
from node.amqp.type_encoding import skip_value

_DUPLICATE_ID_BYTES = message_fields.DUPLICATE_ID_PROPERTY.encode()
_SMALL_ULONG, _PROPERTIES, _APPLICATION_PROPERTIES, _FIRST_BODY_SECTION = 0x53, 0x73, 0x74, 0x75
_LIST8, _STR8 = 0xC0, 0xA1


def dedup_id(payload: bytes) -> str | None:
    found = None  # the message-id, once read
    try:
        position, end = 0, len(payload)
        while position + 3 < end and payload[position] == 0 and payload[position + 1] == _SMALL_ULONG:
            section = payload[position + 2]
            if section >= _FIRST_BODY_SECTION:
                return found  # no application property can follow the body
            at = position + 3
            position = skip_value(payload, at)
            if section == _PROPERTIES:
                if found is not None or not (payload[at] == _LIST8 and payload[at + 2] and payload[at + 3] == _STR8):
                    break  # a second properties section, another layout or id type: the reference reader
                length = payload[at + 4]
                if at + 5 + length > min(position, end):  # past its list, or the bytes
                    break
                found = payload[at + 5:at + 5 + length].decode("utf-8")
            elif section == _APPLICATION_PROPERTIES and _DUPLICATE_ID_BYTES in payload[at:position]:
                break  # the property may be there: the reference reader decides
    except (IndexError, ValueError):
        pass  # the reference reader treats what it cannot read as absent
    return message_fields.dedup_id(payload)
