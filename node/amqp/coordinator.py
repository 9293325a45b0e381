"""The engine loop's transaction coordinator (AMQP 1.0 part 4, issue 31): translates, decides nothing.

Engine loop thread only. Rules:
- A client's sender whose target is a coordinator (capability amqp:local-transactions, or none named)
  becomes a `Controller` link: its transfers are control messages, `declare` (answered `declared` with
  the new id) and `discharge` (answered accepted once the commit is applied and, for durable work, on
  disk; rejected with amqp:transaction:rollback when the node refused the commit and rolled back, or
  amqp:transaction:unknown-id). A coordinator asking for distributed transactions only is refused.
- A transfer whose state is transactional-state (node/amqp/incoming.py hands it here) is checked as any
  send is (queue, permission, group id, size) and held in its transaction (node/core/dispatch/
  transactions.py), answered with transactional-state(accepted) at once; a refused one is rejected
  with its condition and is not part of the transaction. Multicast sends are refused inside a
  transaction (amqp:not-allowed): a later increment may take them.
- A consumer's disposition whose state is transactional-state (node/amqp/outgoing.py hands it here)
  is held in its transaction; the delivery stays unsettled, and its group with its consumer, until the
  discharge; the node shell's commit or rollback settles it (node/core/transaction_commit.py). One naming
  an unknown transaction, or no outcome, is not taken: the consumer's link is detached with the condition
  (its unsettled deliveries go back to their groups, as at any detach).
- A transaction id is used only on the connection that declared it; anything else is unknown-id.
- A commit's journal records (its sends' STOREs, its accepts' REMOVEs, whatever they caused) are written
  as one batch closed by a commit record: a crash mid-commit recovers to all of it or none.
- When a coordinator link ends (detach, dropped connection) its transactions are rolled back; when a
  consumer ends, transactions holding its outcomes can only roll back (their messages went back).
"""

from __future__ import annotations

from node.amqp import codec
from node.amqp.conditions import condition_for
from node.amqp.engine import ffi, lib, symbols
from node.amqp.links import Producer
from node.core.access.roles import Permission
from node.core.dispatch.message import Message, Outcome
from node.core.dispatch.transactions import Transactions, UnknownTransaction
from node.core.errors import GrouperError, InvalidField, NotAllowed, NotFound, ResourceLimitExceeded

COORDINATOR = lib.PN_COORDINATOR  # a terminus type
TRANSACTIONAL_STATE = 0x34  # AMQP 1.0 4.5.5: a delivery state naming the transaction (and an outcome)
DECLARED = 0x33  # AMQP 1.0 4.5.4: the outcome of a declare, with the new transaction id
LOCAL_TRANSACTIONS = "amqp:local-transactions"
CONTROL_DATA_CAPACITY = 16  # pn_data nodes a control message or a delivery state is decoded into (grows)
_AMQP_VALUE = (0x77, "amqp:amqp-value:*")
_DECLARE = (0x31, "amqp:declare:list")
_DISCHARGE = (0x32, "amqp:discharge:list")
_OUTCOMES = {0x24: Outcome.ACCEPTED, 0x25: Outcome.REJECTED, 0x26: Outcome.RELEASED, 0x27: Outcome.MODIFIED}


class Controller(Producer):
    """A coordinator link: its transfers are declare and discharge requests."""

    __slots__ = ()


class Coordinator:
    def __init__(self, server):
        self.server = server
        self.transactions = Transactions()

    # ---- the coordinator link ----------------------------------------------------------------------

    def attach(self, link, connection, next_id: int) -> None:
        """Raises NotAllowed for a coordinator that asks for distributed transactions only."""
        capabilities = set(symbols(lib.pn_terminus_capabilities(lib.pn_link_remote_target(link))))
        if capabilities and LOCAL_TRANSACTIONS not in capabilities:
            raise NotAllowed(f"this node coordinates local transactions only ({LOCAL_TRANSACTIONS}); "
                             f"the coordinator asked for {sorted(capabilities)}")
        server = self.server
        state = Controller(next_id, link, connection, None)
        server.producers[state.id] = state
        server._links[link] = state
        connection.links.add(state)
        lib.pn_link_set_rcv_settle_mode(link, lib.pn_link_remote_rcv_settle_mode(link))
        lib.pn_link_open(link)
        lib.pn_link_flow(link, server.config.producer_credit_window)

    def ended(self, controller) -> None:
        """A coordinator link ended: its open transactions roll back."""
        server = self.server
        now_ms = server.clock_ms()
        for transaction in self.transactions.controller_ended(controller.id):
            server.execute(server.shell.roll_back(transaction, now_ms))

    def consumer_gone(self, consumer_id: int) -> None:
        self.transactions.consumer_gone(consumer_id)

    # ---- transfers: control messages and transactional sends ----------------------------------------

    def receive(self, producer, delivery, payload: bytes) -> None:
        server = self.server
        incoming = (producer, delivery)
        try:
            if type(producer) is Controller:
                self._control(producer, delivery, payload)
            else:
                transaction_id = _state_fields(lib.pn_delivery_remote(delivery))[0]
                self._send(producer, delivery, payload, self._owned(transaction_id, producer.connection))
        except GrouperError as error:
            server.refuse(incoming, error)

    def _control(self, controller, delivery, payload: bytes) -> None:
        kind, fields = _control_body(payload)
        server = self.server
        if kind == _DECLARE:
            transaction_id = self.transactions.declare(controller.id)
            data = lib.pn_disposition_data(lib.pn_delivery_local(delivery))
            lib.pn_data_clear(data)
            lib.pn_data_put_list(data)
            lib.pn_data_enter(data)
            lib.pn_data_put_binary(data, (len(transaction_id), ffi.from_buffer(transaction_id)))
            lib.pn_data_exit(data)
            lib.pn_delivery_update(delivery, DECLARED)
            lib.pn_delivery_settle(delivery)
            server._dirty.add(controller.connection)
            return
        if not fields or not isinstance(fields[0], bytes):
            raise InvalidField("a discharge names the transaction id (binary) it ends")
        fail = len(fields) > 1 and fields[1] is True
        transaction = self.transactions.discharge(self._owned(fields[0], controller.connection), controller.id)
        now_ms = server.clock_ms()
        if fail:
            server.execute(server.shell.roll_back(transaction, now_ms))
            server.accept_when_stored((controller, delivery), False, False)
        else:  # the commit's journal records are one batch with a commit record (node/store/journal.py)
            journal = server.journal
            mark = journal.transaction_begin() if journal is not None else None
            server.execute(server.shell.commit(transaction, (controller, delivery), now_ms))
            if journal is not None:
                journal.transaction_end(mark)

    def _owned(self, transaction_id, connection) -> bytes:
        if not isinstance(transaction_id, bytes):
            raise UnknownTransaction("a transactional transfer or outcome names no transaction id (binary)")
        controller = self.server.producers.get(self.transactions.get(transaction_id).controller)
        if controller is None or controller.connection is not connection:
            raise UnknownTransaction(f"transaction {transaction_id!r} was declared on another connection")
        return transaction_id

    def _send(self, producer, delivery, payload: bytes, transaction_id: bytes) -> None:
        """A send inside a transaction, checked as any send is, held until the discharge."""
        server = self.server
        broker = server.broker
        now_ms = server.clock_ms()
        address = producer.address
        if address is not None and broker.addresses.is_multicast(address):
            raise NotAllowed(f"sends to multicast address {address!r} are not taken inside a transaction yet; "
                             f"send them outside one")
        queue = broker.queue(address, create=True) if address else None
        arrival = codec.read_arrival(payload, queue.settings.group_header if queue else "", now_ms)
        if queue is None:
            if not arrival.address:
                raise NotFound("anonymous link: the message's 'to' field must name a queue")
            if broker.addresses.is_multicast(arrival.address):
                raise NotAllowed(f"sends to multicast address {arrival.address!r} are not taken inside a "
                                 f"transaction yet; send them outside one")
            queue = server.link_attach.authorized_queue(producer.connection, arrival.address, Permission.SEND)
            if queue.settings.group_header:
                arrival = codec.read_arrival(payload, queue.settings.group_header, now_ms)
        # journalled only when its queue is durable and so is the message (as outside a transaction)
        durable = arrival.durable and queue.settings.durable and server.journal is not None
        if durable and server.durability.refusing(now_ms):
            raise ResourceLimitExceeded(f"the node cannot store messages right now "
                                        f"({server.durability.failure}); retry later")
        message = Message(payload, arrival.group_id, expires_at_ms=arrival.expires_at_ms,
                          closes_group=arrival.closes_group, transient=not arrival.durable)
        queue.check_enqueue(message.group_id, message.size_bytes)
        route_key = queue.route_key(message.group_id) if server.cluster is not None else None
        self.transactions.send(transaction_id, queue.settings.name, message, durable, route_key, None)
        _reply_transactional(delivery, transaction_id, lib.pn_delivery_settled(delivery))
        server._dirty.add(producer.connection)

    # ---- consumers' outcomes inside a transaction --------------------------------------------------

    def disposition(self, consumer, delivery, delivery_id: int) -> None:
        fields = _state_fields(lib.pn_delivery_remote(delivery))
        outcome = _OUTCOMES.get(fields[1] if len(fields) > 1 else None)
        try:
            transaction_id = self._owned(fields[0] if fields else None, consumer.connection)
            if outcome is None:
                raise InvalidField("a transactional outcome names accepted, rejected, released or modified")
            self.transactions.settle(transaction_id, consumer.id, delivery_id, outcome, outcome is Outcome.MODIFIED,
                                     (consumer, delivery))
        except GrouperError as error:
            # the outcome is not taken: the delivery stays unsettled, with its consumer, as before it came
            self.server.link_table.close(consumer.link, condition_for(error))
            return
        del consumer.unsettled[delivery]


def _reply_transactional(delivery, transaction_id: bytes, settled: bool) -> None:
    """Answer a transactional send with transactional-state(accepted) and settle it (AMQP 1.0 4.4.2)."""
    if not settled:
        data = lib.pn_disposition_data(lib.pn_delivery_local(delivery))
        lib.pn_data_clear(data)
        lib.pn_data_put_list(data)
        lib.pn_data_enter(data)
        lib.pn_data_put_binary(data, (len(transaction_id), ffi.from_buffer(transaction_id)))
        lib.pn_data_put_described(data)
        lib.pn_data_enter(data)
        lib.pn_data_put_ulong(data, 0x24)
        lib.pn_data_put_list(data)
        lib.pn_data_exit(data)
        lib.pn_data_exit(data)
        lib.pn_delivery_update(delivery, TRANSACTIONAL_STATE)
    lib.pn_delivery_settle(delivery)


def _state_fields(disposition) -> list:
    """[transaction id, outcome code] of a transactional-state the peer sent (values it lacks: None)."""
    data = lib.pn_disposition_data(disposition)
    lib.pn_data_rewind(data)
    if not lib.pn_data_next(data) or lib.pn_data_type(data) != lib.PN_LIST:
        return [None, None]
    lib.pn_data_enter(data)
    fields = [_value(data) if lib.pn_data_next(data) else None]
    outcome = None
    if lib.pn_data_next(data) and lib.pn_data_is_described(data):
        lib.pn_data_enter(data)
        if lib.pn_data_next(data) and lib.pn_data_type(data) == lib.PN_ULONG:
            outcome = lib.pn_data_get_ulong(data)
        lib.pn_data_exit(data)
    lib.pn_data_exit(data)
    return fields + [outcome]


def _control_body(payload: bytes) -> tuple[tuple, list]:
    """(_DECLARE or _DISCHARGE, the list's fields) of a control message; InvalidField for anything else."""
    data = lib.pn_data(CONTROL_DATA_CAPACITY)
    try:
        buffer = ffi.from_buffer(payload)
        position = 0
        while position < len(payload):
            lib.pn_data_clear(data)
            used = lib.pn_data_decode(data, buffer + position, len(payload) - position)
            if used <= 0:
                break
            position += used
            lib.pn_data_rewind(data)
            if not (lib.pn_data_next(data) and lib.pn_data_is_described(data)):
                continue
            lib.pn_data_enter(data)
            lib.pn_data_next(data)
            if _descriptor(data) not in _AMQP_VALUE:
                continue
            lib.pn_data_next(data)
            if lib.pn_data_is_described(data):
                lib.pn_data_enter(data)
                lib.pn_data_next(data)
                descriptor = _descriptor(data)
                for kind in (_DECLARE, _DISCHARGE):
                    if descriptor in kind and lib.pn_data_next(data) and lib.pn_data_type(data) == lib.PN_LIST:
                        return kind, _list(data)
            break
    finally:
        lib.pn_data_free(data)
    raise InvalidField("a coordinator link takes declare and discharge bodies (amqp-value) only")


def _descriptor(data):
    kind = lib.pn_data_type(data)
    if kind == lib.PN_ULONG:
        return lib.pn_data_get_ulong(data)
    if kind == lib.PN_SYMBOL:
        return _bytes(lib.pn_data_get_symbol(data)).decode("ascii", "replace")
    return None


def _list(data) -> list:
    fields = []
    lib.pn_data_enter(data)
    while lib.pn_data_next(data):
        fields.append(_value(data))
    lib.pn_data_exit(data)
    return fields


def _value(data):
    kind = lib.pn_data_type(data)
    if kind == lib.PN_BINARY:
        return _bytes(lib.pn_data_get_binary(data))
    if kind == lib.PN_BOOL:
        return bool(lib.pn_data_get_bool(data))
    return None


def _bytes(value) -> bytes:
    return ffi.unpack(value.start, value.size)
