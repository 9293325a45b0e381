"""bench/decision_latency.py's rows from the probes' records: a message's first receipt is found by its
send time, and a row counts what was accepted, received, kept on the producer's node or forwarded."""

from __future__ import annotations

from bench.decision_latency import existing_row, first_receipts, new_group_row
from bench.probes import ACCEPTED, RELEASED

MS = 1_000_000  # ns


def test_the_first_receipt_of_a_message_wins_and_names_the_node_that_received_it():
    received = {"consumer-node1": {"sent_ns": [10 * MS, 20 * MS], "received_ns": [13 * MS, 26 * MS]},
                "consumer-node3": {"sent_ns": [10 * MS], "received_ns": [30 * MS]}}

    assert first_receipts(received, [0, 2]) == {10 * MS: (13 * MS, 0), 20 * MS: (26 * MS, 0)}


def test_a_new_group_row_counts_accepted_received_and_placed_on_the_producer_s_node():
    sent = {"sent_ns": [0, 10 * MS, 20 * MS], "settled_ns": [2 * MS, 13 * MS, 21 * MS],
            "states": [ACCEPTED, ACCEPTED, RELEASED]}
    receipts = {0: (4 * MS, 1), 10 * MS: (15 * MS, 2)}

    row = new_group_row(sent, receipts, 1)

    assert (row["producer_node"], row["sent"], row["not_accepted"], row["received"],
            row["placed_on_producer_node"]) == (2, 3, 1, 2, 1)
    assert row["accept"]["count"] == 2 and row["receive"]["max_ms"] == 5.0


def test_messages_to_routed_groups_are_local_when_the_producer_s_node_received_them():
    sent = {"sent_ns": [0, 10 * MS, 20 * MS], "settled_ns": [1 * MS, 12 * MS, 22 * MS],
            "states": [ACCEPTED, ACCEPTED, ACCEPTED]}
    receipts = {0: (2 * MS, 0), 10 * MS: (16 * MS, 1)}

    row = existing_row(sent, receipts, 0)

    assert row["producer_node"] == 1 and row["missing"] == 1
    assert row["local_receive"]["max_ms"] == 2.0 and row["forwarded_receive"]["max_ms"] == 6.0
