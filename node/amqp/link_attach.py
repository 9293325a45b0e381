"""The engine loop's answer to a client's attach: who may use which queue, subscriptions, and the new
link's record.

Engine loop thread only. Rules:
- A consumer's source, or a producer's target, names a queue (with parameters that shape a queue
  created here: 'orders?group-buckets=1024'), a multicast address, or ADDRESS::QUEUE. Permissions are
  decided on the queue name alone, so parameters never widen them; a refusal names no queue the user
  may not use.
- A link the node refuses gets an attach whose terminus is null (the source of a consumer, the
  target of a producer), then a detach with the condition (AMQP 1.0, 2.6.3).
- A consumer of a multicast address (or of an unknown one, with the topic capability) is subscribed
  through a queue of its own, made here (`Broker.subscribe`); it is temporary unless the link asked
  for a durable subscription (expiry policy never). Deleting it (`unsubscribe`) waits for its last
  consumer, and removes a durable one from the journal.
- A consumer's JMS selector (source filter `apache.org:selector-filter:string`) is compiled before
  anything is made for the link, so a malformed one refuses the attach with its error and position;
  an applied one is echoed in the node's attach and every other filter left out (source_filters.py).
- A producer's link gets the producer credit window at once, and MESSAGE_SIZE_MAX_BYTES as its
  max-message-size (node/amqp/incoming.py enforces it).
"""

from __future__ import annotations

from node.amqp.conditions import condition_for
from node.amqp.coordinator import COORDINATOR
from node.amqp.engine import lib, symbols, text
from node.amqp.incoming import MESSAGE_SIZE_MAX_BYTES
from node.amqp.links import DURABLE, TEMPORARY, Consumer, Producer
from node.amqp.message_fields import MessageFields
from node.amqp.source_filters import applied_selector, echo, resolve_next_free
from node.core.access.roles import Permission
from node.core.dispatch.address_settings import split_address
from node.core.dispatch.addresses import (EXISTING_QUEUE_CAPABILITY, TOPIC_CAPABILITY, no_such_queue, split_fqqn,
                                 subscription_name)
from node.core.dispatch.selector_dispatch import MessageSelector
from node.core.errors import AlreadyExists, GrouperError, NotFound

SND_SETTLED = lib.PN_SND_SETTLED
DIST_MODE_COPY = lib.PN_DIST_MODE_COPY
UNSPECIFIED = lib.PN_UNSPECIFIED


class LinkAttach:
    def __init__(self, server):
        self.server = server
        self.broker = server.broker
        self.security = server.gate.security  # its `access` is replaced when the users file is read again

    def on_link_remote_open(self, event) -> None:
        server = self.server
        link = lib.pn_event_link(event)
        connection = server.connections.of(event)
        if connection is None or not connection.key:
            return  # the connection was refused
        server._dirty.add(connection)
        lib.pn_terminus_copy(lib.pn_link_source(link), lib.pn_link_remote_source(link))
        # AMQP 1.0 3.5.8: a node leaves out of its attach the filters it does not apply, so the client knows
        # (Qpid JMS then refuses the consumer); a consumer's applied selector is echoed (source_filters.py)
        lib.pn_data_clear(lib.pn_terminus_filter(lib.pn_link_source(link)))
        lib.pn_terminus_copy(lib.pn_link_target(link), lib.pn_link_remote_target(link))
        sender = lib.pn_link_is_sender(link)
        try:
            if not sender and lib.pn_terminus_get_type(lib.pn_link_remote_target(link)) == COORDINATOR:
                server.coordinator.attach(link, connection, self._next_id())  # issue 31: node/amqp/coordinator.py
            elif sender:
                self._open_consumer(link, connection)
            else:
                self._open_producer(link, connection)
        except GrouperError as error:
            # AMQP 1.0, 2.6.3: the terminus the client asked for is null in our attach, then the detach says why
            lib.pn_terminus_set_type(lib.pn_link_source(link) if sender else lib.pn_link_target(link), UNSPECIFIED)
            lib.pn_link_open(link)
            server.link_table.close(link, condition_for(error))

    def _open_consumer(self, link, connection) -> None:
        server = self.server
        source = lib.pn_link_remote_source(link)
        address = text(lib.pn_terminus_get_address(source))
        if not address:
            raise NotFound("a consumer link needs a source address naming a queue")
        applied = applied_selector(lib.pn_terminus_filter(source))  # a malformed one refuses the attach
        now_ms = server.clock_ms()
        browse = lib.pn_terminus_get_distribution_mode(source) == DIST_MODE_COPY
        permission = Permission.BROWSE if browse else Permission.CONSUME
        consumer_id = self._next_id()
        subscribed = self._subscription(link, connection, address, permission, consumer_id)
        if subscribed is not None:
            queue, subscription = subscribed
        else:
            create = EXISTING_QUEUE_CAPABILITY not in symbols(lib.pn_terminus_capabilities(source))
            queue, subscription = self.authorized_queue(connection, address, permission, create), ""
        address = queue.settings.name  # without the address's parameters
        try:
            applied = resolve_next_free(applied, queue)  # issue 30: a null session filter gets a free group
            effects = self.broker.attach_consumer(
                address, consumer_id, browse, now_ms, server.config.link_unsettled_max,
                None if applied is None else MessageSelector(applied.selector, MessageFields))
        except GrouperError:
            if subscription == TEMPORARY:
                self.unsubscribe(address)
            raise
        presettled = lib.pn_link_remote_snd_settle_mode(link) == SND_SETTLED
        label = f"{text(lib.pn_connection_remote_container(connection.connection)) or ''}/" \
                f"{text(lib.pn_link_name(link)) or ''}"
        state = Consumer(consumer_id, link, connection, address, browse, presettled,
                         queue.settings.group_first_key, label)
        state.subscription = subscription
        server.consumers[consumer_id] = state
        server._links[link] = state
        connection.links.add(state)
        lib.pn_link_set_snd_settle_mode(link, lib.pn_link_remote_snd_settle_mode(link))
        lib.pn_link_set_rcv_settle_mode(link, lib.pn_link_remote_rcv_settle_mode(link))
        echo(lib.pn_terminus_filter(lib.pn_link_source(link)), applied)
        lib.pn_link_open(link)
        if queue.settings.trace and not browse:
            server.tracer.attached(consumer_id, label, address)
        server.apply(effects)
        if lib.pn_link_credit(link):
            server.outgoing.credit(state)

    def _subscription(self, link, connection, address: str, permission: Permission, consumer_id: int):
        """(queue, Consumer.subscription) when a consumer's `address` names a subscription: ADDRESS::QUEUE,
        or a multicast address (or any unknown one with the topic capability), which subscribes the link
        through a queue of its own, created here if need be. None: `address` names a queue."""
        broker = self.broker
        if address in broker.queues:
            return None  # a queue whose name has '::' in it is still reached by that name
        access = self.security.access
        user = connection.user
        fqqn = split_fqqn(address)
        if fqqn is not None:
            name, queue_name = fqqn
            access.check(user, permission, queue_name)
            queue = broker.queues.get(queue_name)
            if queue is not None:
                if queue.settings.address != name:
                    bound = f"subscribes to {queue.settings.address!r}" if queue.settings.address else "is an anycast queue"
                    raise AlreadyExists(f"queue {queue_name!r} {bound}, not to address {name!r}: attach to "
                                        f"{queue.settings.address or queue_name}{'::' + queue_name if queue.settings.address else ''}")
                return queue, ""
            self._check_multicast(name)
            access.check(user, Permission.CREATE, queue_name)
            return broker.subscribe(name, queue_name), ""  # as Artemis auto-creates a queue named by its FQQN
        source = lib.pn_link_remote_source(link)
        topic = TOPIC_CAPABILITY in symbols(lib.pn_terminus_capabilities(source))
        if not (topic or broker.addresses.is_multicast(address)):
            return None
        if "?" in address:
            raise NotFound(f"{address!r}: a subscription takes its settings from the address settings; attach to "
                           f"the address without parameters")
        access.check(user, permission, address)
        durable = lib.pn_terminus_get_expiry_policy(source) == lib.PN_EXPIRE_NEVER
        container = text(lib.pn_connection_remote_container(connection.connection)) or ""
        name = subscription_name(container, text(lib.pn_link_name(link)) or "", durable, consumer_id)
        queue = broker.queues.get(name)
        if queue is not None:  # a durable subscription attached again
            if queue.settings.address != address:
                raise AlreadyExists(f"subscription queue {name!r} (container id '.' link name) exists for "
                                    f"{queue.settings.address or 'no address'!r}, not {address!r}: use another "
                                    f"link name, or detach with close to end that subscription")
            return queue, DURABLE
        self._check_multicast(address)
        access.check(user, Permission.CREATE, address)
        return broker.subscribe(address, name, durable=durable), DURABLE if durable else TEMPORARY

    def _check_multicast(self, address: str) -> None:
        """`address` can take a new subscription: multicast already, or unknown (becoming multicast, as
        Artemis auto-creates an address) when auto-create is on."""
        if self.broker.addresses.is_multicast(address):
            return
        if address in self.broker.queues:
            raise AlreadyExists(f"{address!r} is an anycast queue, not a multicast address: consume it by its "
                                f"name, without ADDRESS::QUEUE or the topic capability")
        if not self.broker.auto_create:
            raise NotFound(f"no multicast address {address!r} on this node and auto-create is off: declare it "
                           f"with an [[address]] table")

    def unsubscribe(self, name: str) -> None:
        """Delete a subscription queue its link made, once no consumer is left on it."""
        queue = self.broker.queues.get(name)
        if queue is None or queue.consumers:
            return
        durable = queue.settings.durable
        server = self.server
        server.apply(self.broker.unsubscribe(name))  # in a cluster, on every node (node/core/cluster/definitions.py)
        if durable and server.journal is not None:
            server.journal.delete(name)

    def _open_producer(self, link, connection) -> None:
        server = self.server
        target = lib.pn_link_remote_target(link)
        address = text(lib.pn_terminus_get_address(target))
        if address and self.broker.addresses.is_multicast(address):  # copied to its subscriptions
            self.security.access.check(connection.user, Permission.SEND, address)
        elif address:  # messages to 'orders?group-buckets=8' go to orders
            create = EXISTING_QUEUE_CAPABILITY not in symbols(lib.pn_terminus_capabilities(target))
            address = self.authorized_queue(connection, address, Permission.SEND, create).settings.name
        state = Producer(self._next_id(), link, connection, address or None)
        server.producers[state.id] = state
        server._links[link] = state
        connection.links.add(state)
        lib.pn_link_set_max_message_size(link, MESSAGE_SIZE_MAX_BYTES)
        lib.pn_link_set_rcv_settle_mode(link, lib.pn_link_remote_rcv_settle_mode(link))
        lib.pn_link_open(link)
        lib.pn_link_flow(link, server.config.producer_credit_window)

    def authorized_queue(self, connection, address: str, permission: Permission, create: bool = True):
        """The queue `address` names, if the connection's user holds `permission` on it, and may create
        it when it does not exist yet (and `create`: the link did not ask for an existing queue only);
        raises Unauthorized (or NotFound) otherwise. The address's
        parameters ('orders?group-buckets=1024') shape a queue created here, and must match an existing
        one; permissions are decided on the queue name alone, so parameters never widen them."""
        broker = self.broker
        # a queue declared with a '?' in its name is still reached by that name
        name, parameters = (address, {}) if address in broker.queues else split_address(address)
        access = self.security.access
        fqqn = split_fqqn(name) if name not in broker.queues else None
        if fqqn is not None:  # one subscription of a multicast address, which must exist (Artemis's FQQN)
            multicast, name = fqqn
            queue = broker.queues.get(name)
            if queue is None or queue.settings.address != multicast or parameters:
                raise NotFound(f"{address!r}: no subscription queue {name!r} of address {multicast!r} on this node"
                               f"{' (parameters are not taken here)' if parameters else ''}")
            access.check(connection.user, permission, name)
            return queue
        access.check(connection.user, permission, name)
        if name not in broker.queues and not create:
            # only names the user may use this way are offered: the refusal tells no other queue's name
            raise NotFound(no_such_queue(name, (other for other in broker.queues
                                                if access.allows(connection.user, permission, other))))
        if name not in broker.queues and broker.auto_create:
            access.check(connection.user, Permission.CREATE, name)
        return broker.queue(name, create=True, parameters=parameters)

    def _next_id(self) -> int:
        server = self.server
        link_id = server._next_link_id
        server._next_link_id += 1
        return link_id
