"""Examples of the open transactions' bookkeeping (node/core/dispatch/transactions.py, issue 31)."""

from __future__ import annotations

import pytest

from node.core.dispatch import transactions as module
from node.core.dispatch.message import Message, Outcome
from node.core.dispatch.transactions import Transactions, UnknownTransaction
from node.core.errors import ResourceLimitExceeded


def test_a_controller_past_its_open_transactions_limit_is_refused_and_others_are_not(monkeypatch):
    monkeypatch.setattr(module, "TRANSACTIONS_PER_CONTROLLER_MAX", 2)
    transactions = Transactions()
    transactions.declare(1)
    transactions.declare(1)
    with pytest.raises(ResourceLimitExceeded, match="discharge one"):
        transactions.declare(1)
    transactions.declare(2)
    assert len(transactions) == 3


def test_a_transaction_past_its_work_limit_refuses_more_and_keeps_what_it_has(monkeypatch):
    monkeypatch.setattr(module, "WORK_PER_TRANSACTION_MAX", 2)
    transactions = Transactions()
    transaction_id = transactions.declare(1)
    transactions.send(transaction_id, "q", Message(b"1", "g"), False, None, None)
    transactions.settle(transaction_id, 7, 1, Outcome.ACCEPTED, False, None)
    with pytest.raises(ResourceLimitExceeded, match="commit it"):
        transactions.send(transaction_id, "q", Message(b"3", "g"), False, None, None)
    assert transactions.get(transaction_id).work_count == 2


def test_a_delivery_settles_in_one_transaction_once():
    transactions = Transactions()
    first, second = transactions.declare(1), transactions.declare(1)
    transactions.settle(first, 7, 1, Outcome.ACCEPTED, False, None)
    with pytest.raises(UnknownTransaction, match="settled once"):
        transactions.settle(second, 7, 1, Outcome.ACCEPTED, False, None)
    transactions.discharge(first, 1)
    assert not transactions.holds(7, 1)  # discharged: free again


def test_only_the_declaring_controller_discharges_and_a_discharged_id_is_unknown():
    transactions = Transactions()
    transaction_id = transactions.declare(1)
    with pytest.raises(UnknownTransaction, match="another coordinator link"):
        transactions.discharge(transaction_id, 2)
    transactions.discharge(transaction_id, 1)
    with pytest.raises(UnknownTransaction, match="no open transaction"):
        transactions.discharge(transaction_id, 1)


def test_a_consumer_gone_marks_only_the_transactions_holding_its_deliveries_rollback_only():
    transactions = Transactions()
    holding, other = transactions.declare(1), transactions.declare(1)
    transactions.settle(holding, 7, 1, Outcome.ACCEPTED, False, None)
    transactions.settle(other, 8, 1, Outcome.ACCEPTED, False, None)
    transactions.consumer_gone(7)
    assert "detached" in transactions.get(holding).rollback_only
    assert transactions.get(other).rollback_only is None
