"""The engine loop's attached links, by proton's link pointer: which record an event is for, and how a
link ends.

Engine loop thread only. Rules:
- `server._links` maps a pointer to its `links.Consumer` or `links.Producer` while the link is attached;
  `server.consumers` and `server.producers` map their ids to the same records. A delivery or flow event
  on a pointer no longer in the table is for a link the node has let go of, and is ignored (proton
  frees its deliveries with it).
- A link the client detaches without closing it (closed=false, a suspended link) ends its consumer
  at once, as a closed one does: its unsettled messages are released in order and its groups freed.
  The detach is answered in kind; the node keeps no suspended link to resume: a client that attaches
  again is a new consumer.
- A subscription a topic attach made is deleted when its link ends, unless the link asked for a durable
  one: that one goes only when the client closes the link (node/amqp/link_attach.py unsubscribes).
- A link is freed here when the client's detach arrives; a detach from this side (`close`) only sets
  the condition and closes the local end.
"""

from __future__ import annotations

from node.amqp.conditions import RESOURCE_DELETED, condition_for
from node.amqp.engine import LINK_REMOTE_CLOSE, LINK_REMOTE_DETACH, LOCAL_ACTIVE, lib, set_condition
from node.amqp.links import DURABLE, TEMPORARY, Producer
from node.core.effects import DetachConsumer


class LinkTable:
    def __init__(self, server):
        self.server = server
        self._links = server._links
        self.consumers = server.consumers
        self.producers = server.producers
        # per-message work, bound once: a transfer goes to incoming, an outcome and credit to outgoing
        self._receive = server.incoming.receive
        self._disposition = server.outgoing.disposition
        self._credit = server.outgoing.credit

    # ---- events on an attached link ----------------------------------------------------------

    def on_delivery(self, event) -> None:
        delivery = lib.pn_event_delivery(event)
        state = self._links.get(lib.pn_delivery_link(delivery))
        if state is None:
            return  # a link the node has let go of; proton frees its deliveries with it
        if state.producer:
            self._receive(state, delivery)
        elif lib.pn_delivery_updated(delivery):
            self._disposition(state, delivery)

    def on_link_flow(self, event) -> None:
        state = self._links.get(lib.pn_event_link(event))
        if state is not None and not state.producer:
            self._credit(state)

    def on_link_remote_close(self, event) -> None:
        """A detach from the client, closed or not: the link ends here either way (see the header)."""
        link = lib.pn_event_link(event)
        state = self._links.get(link)
        if state is not None:
            self.forget(state)
            if getattr(state, "subscription", "") == DURABLE and lib.pn_event_type(event) == LINK_REMOTE_CLOSE:
                self.server.link_attach.unsubscribe(state.queue)  # closed, not detached: the client ends it
        connection = self.server.connections.of(event)
        if connection is not None:
            self.server._dirty.add(connection)
        if lib.pn_link_state(link) & LOCAL_ACTIVE:
            if lib.pn_event_type(event) == LINK_REMOTE_DETACH:
                lib.pn_link_detach(link)  # answered in kind: the client may mean to attach again
            else:
                lib.pn_link_close(link)
        lib.pn_link_free(link)

    # ---- ends --------------------------------------------------------------------------------

    def forget(self, state) -> None:
        """The link has ended: no record names it any more, and the core lets go of its consumer."""
        self._unlink(state)
        self._ended(state, self.server.clock_ms())

    def forget_all(self, states: list) -> None:
        """The links of a connection that has ended (already taken out of `connection.links`)."""
        now_ms = self.server.clock_ms()
        # coordinators last (issue 31): their rollbacks would otherwise give messages back to the
        # connection's own consumers, whose detach then gives them back again, counting two failures
        for state in sorted(states, key=lambda state: type(state) is not Producer and state.producer):
            state.alive = False
            self._links.pop(state.link, None)
            self._ended(state, now_ms, "connection closed")

    def _ended(self, state, now_ms: int, *reason: str) -> None:
        server = self.server
        if state.producer:
            self.producers.pop(state.id, None)
            if type(state) is not Producer:  # a coordinator: its open transactions roll back (issue 31)
                server.coordinator.ended(state)
        elif self.consumers.pop(state.id, None) is not None:
            server.coordinator.consumer_gone(state.id)
            server.tracer.detached(state.id, state.label, *reason)
            server.apply(server.broker.detach_consumer(state.id, now_ms))
            if state.subscription == TEMPORARY:
                server.link_attach.unsubscribe(state.queue)

    def _unlink(self, state) -> None:
        state.alive = False
        self._links.pop(state.link, None)
        state.connection.links.discard(state)

    def close(self, link, condition) -> None:
        """Detach a link from this side, if it is open here; it is freed when the client's detach arrives."""
        if not lib.pn_link_state(link) & LOCAL_ACTIVE:
            return
        name, description = condition
        set_condition(lib.pn_link_condition(link), name, description)
        lib.pn_link_close(link)

    def detach(self, effect: DetachConsumer) -> None:
        """The core has dropped a consumer (its queue was deleted or changed): detach its link, saying why."""
        state = self.consumers.pop(effect.consumer_id, None)
        if state is None:
            return
        self._unlink(state)  # the core has dropped the consumer already
        self.server.tracer.detached(state.id, state.label, condition_for(effect.error)[0])
        self.close(state.link, condition_for(effect.error))
        self.server._dirty.add(state.connection)

    def detach_producers_of(self, queue_name: str) -> None:
        """A deleted queue's producers are detached too, so they learn it is gone."""
        for state in [state for state in self.producers.values() if state.address == queue_name]:
            self.forget(state)
            self.close(state.link, (RESOURCE_DELETED, f"queue {queue_name!r} was deleted"))
            self.server._dirty.add(state.connection)
