"""Multicast addresses' subscription queues on one node: made, ended, and a send's copies. Pure.

Rules:
- A queue whose settings name an `address` is one of that multicast address's subscriptions
  (node/core/dispatch/addresses.py); a multicast address is never auto-created as a queue of its name.
- A subscription an attach makes takes the settings the address settings give its address, as
  Artemis's address-setting match names addresses; a temporary one lives for one link
  (`Broker.temporary`) and ends with it (`unsubscribe`), in a cluster on every node.
- A send to a multicast address is copied to every subscription queue or to none on this node.
"""

from __future__ import annotations

import dataclasses

from node.core.dispatch.queue import Queue
from node.core.errors import AlreadyExists


class Subscriptions:
    def __init__(self, broker):
        self.broker = broker

    def subscribe(self, address: str, name: str, *, durable: bool | None = None) -> Queue:
        """Create subscription queue `name` of multicast `address` (an attach's). `durable` None: as the
        address settings say; False: a temporary subscription, for one link only."""
        broker = self.broker
        if name in broker.queues:
            raise AlreadyExists(f"queue {name!r} exists; subscribe through {address}::{name} only if it is "
                                f"bound to {address!r}")
        broker.addresses.declare(address)
        settings = broker.address_settings.settings_for(address)
        changes = {"name": name, "address": address}
        if durable is not None:
            changes["durable"] = durable
        queue = broker.make_queue(dataclasses.replace(settings, **changes), temporary=durable is False)
        if durable is False:
            broker.temporary.add(name)
        return queue

    def unsubscribe(self, name: str) -> list:
        """Delete subscription queue `name` because the link that made or resumed it ended (a temporary
        one detached, a durable one closed): in a cluster it ends on every node."""
        broker = self.broker
        effects = broker.delete_queue(name)
        if broker.local is not None:
            broker.local.ended.append(name)
        return effects

    def copies(self, address: str, size_bytes: int, read) -> list:
        """(queue, what `read(group_header)` made of the message for it) for each subscription queue a
        send to multicast `address` is copied to, in name order; `read` is called once per group header.
        Raises, changing nothing, when any copy would be refused, so a send is copied everywhere or
        nowhere on this node."""
        read_for: dict = {}
        copies = []
        queues = self.broker.queues
        for name in self.broker.addresses.subscriptions(address):
            queue = queues[name]
            header = queue.settings.group_header
            if header not in read_for:
                read_for[header] = read(header)
            arrival = read_for[header]
            queue.check_enqueue(arrival.group_id, size_bytes)
            copies.append((queue, arrival))
        return copies
