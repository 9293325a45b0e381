"""Local transactions (AMQP 1.0 part 4, issue 31): what each open transaction holds until it is discharged.

Pure: no proton, no clock, no I/O. The engine loop's coordinator (node/amqp/coordinator.py) declares
transactions here, adds the work its transactional transfers and dispositions carry, and discharges them;
the node shell (node/core/shell.py `commit` / `roll_back`) applies a discharged transaction to the broker.
Rules:
- A transaction belongs to the coordinator link that declared it (`controller`, the link's id): only that
  link discharges it, and when that link ends (a detach or a dropped connection) its transactions are
  rolled back (`controller_ended`).
- Work is kept in arrival order: sends as (queue, Message, durable, route key, target) and dispositions as
  (consumer id, delivery id, outcome, delivery failed, target). `target` is the adapter's opaque handle,
  handed back untouched. Nothing reaches the broker before the commit: sends are enqueued at commit, in
  order; dispositions take effect at commit; so a rollback leaves no trace of the sends, and the
  transaction's deliveries stay with their consumer (and so their groups) until the discharge.
- A delivery can be in one transaction only, once: a second transactional outcome for it is refused.
- A transaction whose work can no longer be committed whole is marked rollback-only with the reason
  (`consumer_gone`: a consumer whose delivery it settles has detached, and the broker gave that message
  back); its commit is refused with TransactionRolledBack and it is rolled back instead, never half done.
- Limits: TRANSACTIONS_PER_CONTROLLER_MAX open transactions per coordinator link, WORK_PER_TRANSACTION_MAX
  sends plus dispositions per transaction; past either, the request is refused (ResourceLimitExceeded)
  and nothing changes.
"""

from __future__ import annotations

from typing import NamedTuple

from node.core.errors import GrouperError, ResourceLimitExceeded

TRANSACTIONS_PER_CONTROLLER_MAX = 64  # open transactions one coordinator link may hold
WORK_PER_TRANSACTION_MAX = 100_000  # sends plus dispositions one transaction may hold until its discharge
TRANSACTION_ID_BYTES = 8  # ids are this node's counter, big-endian: unique while the node runs


class UnknownTransaction(GrouperError):
    """The client named a transaction this coordinator link never declared, or one already discharged."""

    fault = "client"


class TransactionRolledBack(GrouperError):
    """A commit the node refused and rolled back instead; the description says why and what to do."""

    fault = "client"


class Send(NamedTuple):
    queue: str
    message: object  # node.core.dispatch.message.Message
    durable: bool
    route_key: str | None  # the group's route across a cluster; None: not routed cluster-wide
    target: object


class Disposition(NamedTuple):
    consumer_id: int
    delivery_id: int
    outcome: object  # node.core.dispatch.message.Outcome
    delivery_failed: bool
    target: object


class Transaction:
    __slots__ = ("id", "controller", "sends", "dispositions", "rollback_only")

    def __init__(self, transaction_id: bytes, controller: int):
        self.id = transaction_id
        self.controller = controller
        self.sends: list[Send] = []
        self.dispositions: list[Disposition] = []
        self.rollback_only: str | None = None  # why its commit must be refused, once known

    @property
    def work_count(self) -> int:
        return len(self.sends) + len(self.dispositions)


class Transactions:
    def __init__(self):
        self._open: dict[bytes, Transaction] = {}
        self._next = 1
        self._held: dict[tuple[int, int], bytes] = {}  # (consumer id, delivery id) -> its transaction

    def __len__(self) -> int:
        return len(self._open)

    def declare(self, controller: int) -> bytes:
        held = sum(1 for transaction in self._open.values() if transaction.controller == controller)
        if held >= TRANSACTIONS_PER_CONTROLLER_MAX:
            raise ResourceLimitExceeded(f"this coordinator link holds {held} open transactions "
                                        f"(TRANSACTIONS_PER_CONTROLLER_MAX); discharge one before declaring another")
        transaction_id = self._next.to_bytes(TRANSACTION_ID_BYTES, "big")
        self._next += 1
        self._open[transaction_id] = Transaction(transaction_id, controller)
        return transaction_id

    def get(self, transaction_id: bytes) -> Transaction:
        transaction = self._open.get(transaction_id)
        if transaction is None:
            raise UnknownTransaction(f"no open transaction {transaction_id!r} on this node: declare one on the "
                                     f"coordinator link, and use its id before discharging it")
        return transaction

    def send(self, transaction_id: bytes, queue: str, message, durable: bool, route_key: str | None,
             target) -> None:
        transaction = self._with_room(transaction_id)
        transaction.sends.append(Send(queue, message, durable, route_key, target))

    def settle(self, transaction_id: bytes, consumer_id: int, delivery_id: int, outcome, delivery_failed: bool,
               target) -> None:
        transaction = self._with_room(transaction_id)
        key = (consumer_id, delivery_id)
        if key in self._held:
            raise UnknownTransaction(f"delivery {delivery_id} already has an outcome in a transaction; a delivery "
                                     f"is settled once")
        self._held[key] = transaction_id
        transaction.dispositions.append(Disposition(consumer_id, delivery_id, outcome, delivery_failed, target))

    def holds(self, consumer_id: int, delivery_id: int) -> bool:
        return (consumer_id, delivery_id) in self._held

    def discharge(self, transaction_id: bytes, controller: int) -> Transaction:
        """The transaction, taken out; the caller commits it (unless `rollback_only` says why not) or rolls
        it back."""
        transaction = self.get(transaction_id)
        if transaction.controller != controller:
            raise UnknownTransaction(f"transaction {transaction_id!r} was declared on another coordinator link; "
                                     f"discharge it there")
        return self._take(transaction)

    def consumer_gone(self, consumer_id: int) -> None:
        """A consumer detached: the broker gave back its unsettled messages, so a transaction that settles
        one of them cannot commit whole."""
        for (held_consumer, delivery_id), transaction_id in self._held.items():
            if held_consumer == consumer_id:
                transaction = self._open[transaction_id]
                if transaction.rollback_only is None:
                    transaction.rollback_only = (f"its consumer {consumer_id} detached before the commit, and "
                                                 f"the messages it took were given back to their groups; "
                                                 f"take them again in a new transaction")

    def controller_ended(self, controller: int) -> list[Transaction]:
        """The coordinator link ended: its open transactions, taken out, to be rolled back."""
        ended = [transaction for transaction in self._open.values() if transaction.controller == controller]
        return [self._take(transaction) for transaction in ended]

    def _with_room(self, transaction_id: bytes) -> Transaction:
        transaction = self.get(transaction_id)
        if transaction.work_count >= WORK_PER_TRANSACTION_MAX:
            raise ResourceLimitExceeded(f"transaction {transaction_id!r} holds {transaction.work_count} sends and "
                                        f"outcomes (WORK_PER_TRANSACTION_MAX); commit it and go on in another")
        return transaction

    def _take(self, transaction: Transaction) -> Transaction:
        del self._open[transaction.id]
        for disposition in transaction.dispositions:
            self._held.pop((disposition.consumer_id, disposition.delivery_id), None)
        return transaction
