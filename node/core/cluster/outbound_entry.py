"""What travels to an owner: a forwarded message (`Entry`) and the journal names of outbound channels.

Rules:
- An Entry is a message accepted here for a group another node owns, as a forwarder sends it and the
  owner's servicer receives it (node/peer/forward_batch.py puts it on the wire).
- The outbound store journals an owner's entries of one queue under one reserved name, OUTBOUND_PREFIX
  owner NUL queue: the NUL-led prefix keeps it apart from every queue name. The names are stored on
  disk: never change them.
- A non-durable send (`not_durable`) is not journalled in the sender's outbound store either: accepted at
  the end of its batch, it waits in memory for its owner (lost if this node crashes first, as AMQP allows
  for a non-durable message); the forward order of the channel is the same for both kinds.
- Pure: no I/O.
"""

from __future__ import annotations

from typing import NamedTuple

from node.core.dispatch.message import TRANSIENT, Message

OUTBOUND_PREFIX = "\x00out\x00"  # journal name of an outbound channel: prefix, owner, NUL, queue


class Entry(NamedTuple):
    """A message on its way to its owner: what a forwarder sends and the owner's servicer receives."""

    forward_seq: int
    queue: str
    group_id: str | None  # None: ungrouped; "" is a group of its own
    payload: bytes  # the encoded AMQP message as received
    expires_at_ms: int  # 0: never
    closes_group: bool
    enqueued_at_ms: int
    # sent non-durable (Message TRANSIENT): the owner journals it in no queue; on the wire `not_durable`, so
    # a sender from before the field means durable
    not_durable: bool = False


def outbound_name(owner: str, queue: str) -> str:
    return f"{OUTBOUND_PREFIX}{owner}\x00{queue}"


def parse_outbound_name(name: str) -> tuple[str, str]:
    owner, _, queue = name[len(OUTBOUND_PREFIX):].partition("\x00")
    return owner, queue


def entry_of(queue: str, message: Message) -> Entry:
    return Entry(message.seq, queue, message.group_id, bytes(message.payload), message.expires_at_ms or 0,
                 message.closes_group, message.enqueued_at_ms or 0, bool(message.flags & TRANSIENT))
