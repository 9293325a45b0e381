"""The drill checker on hand-built logs: one clean run, then each violation and each legal exception."""

from __future__ import annotations

import json

import pytest

from tests.drills.checker import Hold, OrderViolation, Overlap, check, load_jsonl, main


def send(producer: str, group: str, sequence: int, outcome: str = "accepted", queue: str = "q") -> dict:
    return {"kind": "send", "producer": producer, "node": "amqp://n1", "queue": queue, "group": group,
            "sequence": sequence, "sent_ms": 10 * sequence, "settled_ms": 10 * sequence + 1, "outcome": outcome,
            "condition": None if outcome in ("accepted", "timeout") else "amqp:resource-limit-exceeded"}


def delivery(consumer: str, producer: str, group: str, sequence: int, received_ms: int, settled_ms: int | None = None,
             outcome: str = "accepted", confirmed: bool = True, delivery_count: int = 0, queue: str = "q") -> dict:
    settled_ms = received_ms + 1 if settled_ms is None else settled_ms
    return {"kind": "delivery", "consumer": consumer, "node": "amqp://n1", "queue": queue, "group": group,
            "producer": producer, "sequence": sequence, "received_ms": received_ms, "settled_ms": settled_ms,
            "confirmed_ms": settled_ms + 1 if confirmed else None, "delivery_count": delivery_count,
            "outcome": outcome, "settle_confirmed": confirmed}


def clean_run() -> tuple[list[dict], list[dict]]:
    sends = [send(p, g, s) for s in (1, 2, 3) for p in ("p1", "p2") for g in ("a", "b")]
    deliveries = []
    for index, line in enumerate(sends):  # group a to c1, group b to c2, in send order
        consumer = "c1" if line["group"] == "a" else "c2"
        deliveries.append(delivery(consumer, line["producer"], line["group"], line["sequence"], 100 + 10 * index))
    return sends, deliveries


def test_a_clean_run_is_ok_and_counts_every_message():
    report = check(*clean_run())
    assert report.ok, report.summary()
    assert (report.sends, report.accepted, report.deliveries, report.delivered) == (12, 12, 12, 12)
    assert report.redeliveries == 0
    assert report.summary().startswith("ok: 12 sends (12 accepted")


def test_an_accepted_send_nobody_accepted_is_lost():
    sends, deliveries = clean_run()
    deliveries = [d for d in deliveries if (d["producer"], d["group"], d["sequence"]) != ("p2", "b", 2)]
    report = check(sends, deliveries)
    assert report.lost == [("p2", "b", 2)]
    assert not report.ok
    assert "lost: 1, e.g. p2/b#2" in report.summary()


def test_a_refused_send_is_not_lost_and_the_group_goes_on_with_the_next_sequence():
    sends = [send("p", "g", 1), send("p", "g", 2, "rejected"), send("p", "g", 3, "released"), send("p", "g", 4)]
    deliveries = [delivery("c", "p", "g", 1, 100), delivery("c", "p", "g", 4, 110)]
    report = check(sends, deliveries)
    assert report.ok, report.summary()
    assert (report.accepted, report.refused) == (2, 2)


def test_a_refused_send_that_is_delivered_anyway_is_a_violation():
    report = check([send("p", "g", 1, "rejected")], [delivery("c", "p", "g", 1, 100)])
    assert report.refused_delivered == [("p", "g", 1)]
    assert not report.ok


def test_a_timed_out_send_may_be_delivered_or_not():
    sends = [send("p", "g", 1), send("p", "g", 2, "timeout"), send("p", "g", 3, "timeout"), send("p", "g", 4)]
    deliveries = [delivery("c", "p", "g", 1, 100), delivery("c", "p", "g", 2, 110), delivery("c", "p", "g", 4, 120)]
    report = check(sends, deliveries)
    assert report.ok, report.summary()
    assert report.unconfirmed_delivered == [("p", "g", 2)]
    assert report.timed_out == 2


def test_a_delivery_nobody_sent_is_unexpected():
    report = check([send("p", "g", 1)], [delivery("c", "p", "g", 1, 100), delivery("c", "stranger", "g", 7, 110)])
    assert report.unexpected == [("stranger", "g", 7)]
    assert not report.ok


def test_a_message_accepted_with_confirmation_twice_is_a_duplicate():
    report = check([send("p", "g", 1)], [delivery("c1", "p", "g", 1, 100), delivery("c2", "p", "g", 1, 200)])
    assert report.duplicates == [("p", "g", 1)]
    assert not report.ok


def test_a_message_delivered_again_after_a_confirmed_acceptance_is_a_duplicate_whatever_its_fate():
    report = check([send("p", "g", 1)], [delivery("c1", "p", "g", 1, 100),
                                         delivery("c2", "p", "g", 1, 200, outcome="dropped", confirmed=False)])
    assert report.duplicates == [("p", "g", 1)]


def test_a_released_message_redelivered_before_the_next_one_is_legal():
    sends = [send("p", "g", s) for s in (1, 2, 3)]
    deliveries = [delivery("c1", "p", "g", 1, 100), delivery("c1", "p", "g", 2, 110, outcome="released"),
                  delivery("c1", "p", "g", 2, 120, delivery_count=1), delivery("c1", "p", "g", 3, 130)]
    report = check(sends, deliveries)
    assert report.ok, report.summary()
    assert report.redeliveries == 1


def test_a_dropped_delivery_redelivered_to_another_consumer_is_legal():
    sends = [send("p", "g", s) for s in (1, 2, 3)]
    deliveries = [delivery("c1", "p", "g", 1, 100), delivery("c1", "p", "g", 2, 110, 150, "dropped", False),
                  delivery("c2", "p", "g", 2, 120, delivery_count=1), delivery("c2", "p", "g", 3, 130)]
    report = check(sends, deliveries)
    assert report.ok, report.summary()


def test_an_unconfirmed_acceptance_redelivered_after_a_crash_is_not_a_duplicate():
    # the node restarted from its journal: the redelivery carries delivery_count 0
    sends = [send("p", "g", s) for s in (1, 2, 3)]
    deliveries = [delivery("c1", "p", "g", 1, 100), delivery("c1", "p", "g", 2, 110, confirmed=False),
                  delivery("c2", "p", "g", 2, 500), delivery("c2", "p", "g", 3, 510)]
    report = check(sends, deliveries)
    assert report.ok, report.summary()
    assert (report.delivered, report.redeliveries) == (3, 1)


def test_first_acceptances_out_of_sequence_are_an_order_violation():
    sends = [send("p", "g", s) for s in (1, 2, 3)]
    deliveries = [delivery("c", "p", "g", 1, 100), delivery("c", "p", "g", 3, 110), delivery("c", "p", "g", 2, 120)]
    report = check(sends, deliveries)
    assert report.order_violations == [OrderViolation("q", "g", "p", 2, 3, "first accepted after")]
    assert not report.ok
    assert "q/g/p: #2 first accepted after #3" in report.summary()


def test_order_is_per_producer_so_two_producers_may_interleave_freely():
    sends = [send("p1", "g", 1), send("p1", "g", 2), send("p2", "g", 1), send("p2", "g", 2)]
    deliveries = [delivery("c", "p2", "g", 1, 100), delivery("c", "p1", "g", 1, 110),
                  delivery("c", "p1", "g", 2, 120), delivery("c", "p2", "g", 2, 130)]
    assert check(sends, deliveries).ok


def test_equal_stamps_never_prove_an_order_violation():
    sends = [send("p", "g", s) for s in (1, 2)]
    deliveries = [delivery("c2", "p", "g", 2, 100), delivery("c1", "p", "g", 1, 100, 100)]
    assert check(sends, deliveries).order_violations == []


def test_a_redelivery_after_a_later_sequence_was_accepted_is_an_order_violation():
    # #2's first acceptance (unconfirmed) came in order, but it came back after #3 was accepted
    sends = [send("p", "g", s) for s in (1, 2, 3)]
    deliveries = [delivery("c1", "p", "g", 1, 100), delivery("c1", "p", "g", 2, 110, confirmed=False),
                  delivery("c2", "p", "g", 3, 200, 201), delivery("c2", "p", "g", 2, 300, delivery_count=1)]
    report = check(sends, deliveries)
    assert report.order_violations == [OrderViolation("q", "g", "p", 2, 3, "redelivered after the acceptance of")]
    assert report.duplicates == []


def test_a_group_moves_to_another_consumer_once_the_first_settled_everything():
    sends = [send("p", "g", s) for s in (1, 2, 3, 4)]
    deliveries = [delivery("c1", "p", "g", 1, 100, 120), delivery("c1", "p", "g", 2, 101, 130),
                  delivery("c2", "p", "g", 3, 130, 140), delivery("c1", "p", "g", 4, 150, 160)]
    report = check(sends, deliveries)
    assert report.ok, report.summary()


def test_consumers_closed_on_one_node_and_attached_on_another_may_hold_a_group_in_turn():
    # the nemesis follow rounds: c1 on node a is closed with #2 accepted but unconfirmed and #3 dropped;
    # the group follows to c2 on node b, which gets #2 again, #3 and #4; holds in turn, order kept
    sends = [send("p", "g", s) for s in (1, 2, 3, 4)]
    deliveries = [delivery("c1", "p", "g", 1, 100, 101), delivery("c1", "p", "g", 2, 102, 103, confirmed=False),
                  delivery("c1", "p", "g", 3, 104, 105, "dropped", False),
                  delivery("c2", "p", "g", 2, 300), delivery("c2", "p", "g", 3, 310), delivery("c2", "p", "g", 4, 320)]
    for line in deliveries:
        line["node"] = "amqp://a" if line["consumer"] == "c1" else "amqp://b"
    report = check(sends, deliveries)
    assert report.ok, report.summary()
    assert (report.delivered, report.redeliveries) == (4, 2)
    # but the new node handing out the group while the old consumer still held it is caught
    early = [*deliveries[:1], delivery("c1", "p", "g", 2, 102, 400), delivery("c2", "p", "g", 3, 310),
             delivery("c2", "p", "g", 4, 320)]
    assert [(o.earlier.sequence, o.later.consumer, o.later.sequence)
            for o in check(sends, early).exclusivity_violations] == [(2, "c2", 3), (2, "c2", 4)]


def test_a_message_reaching_a_consumer_after_it_closed_was_never_held_by_it():
    # c1 closed; #2, sent to it before the node saw the close, came after c2 had it again and accepted it
    sends = [send("p", "g", s) for s in (1, 2)]
    late = {**delivery("c1", "p", "g", 2, 130, 130, "dropped", False), "after_close": True}
    deliveries = [delivery("c1", "p", "g", 1, 100), delivery("c2", "p", "g", 2, 120, delivery_count=1), late]
    report = check(sends, deliveries)
    assert report.ok, report.summary()
    assert (report.deliveries, report.redeliveries) == (2, 1)
    # without the mark it would be a duplicate: received after a confirmed acceptance
    assert check(sends, [*deliveries[:2], {**late, "after_close": False}]).duplicates == [("p", "g", 2)]


def test_two_consumers_holding_one_group_at_once_is_an_exclusivity_violation():
    sends = [send("p", "g", s) for s in (1, 2)]
    deliveries = [delivery("c1", "p", "g", 1, 100, 200), delivery("c2", "p", "g", 2, 150, 160)]
    report = check(sends, deliveries)
    assert report.exclusivity_violations == [
        Overlap("q", "g", Hold("c1", "p", 1, 100, 200), Hold("c2", "p", 2, 150, 160))]
    assert not report.ok
    assert "exclusivity violations: 1, e.g. q/g: c1 held p#1 [100, 200] while c2 held p#2 [150, 160]" \
        in report.summary()


def test_holds_of_different_groups_or_queues_may_overlap():
    sends = [send("p", "a", 1), send("p", "b", 1), send("p", "a", 1, queue="other")]
    deliveries = [delivery("c1", "p", "a", 1, 100, 200), delivery("c2", "p", "b", 1, 150, 160),
                  delivery("c3", "p", "a", 1, 150, 160, queue="other")]
    assert check(sends[:2], deliveries[:2]).exclusivity_violations == []
    assert check(sends[:1], [deliveries[0], deliveries[2]]).exclusivity_violations == []


def test_a_dropped_hold_does_not_count_against_exclusivity():
    # c1's connection died; the node noticed at some moment before c2 got the group
    sends = [send("p", "g", s) for s in (1, 2)]
    deliveries = [delivery("c1", "p", "g", 1, 100, 300, "dropped", False),
                  delivery("c2", "p", "g", 1, 150, delivery_count=1), delivery("c2", "p", "g", 2, 160)]
    report = check(sends, deliveries)
    assert report.ok, report.summary()


def test_logs_of_the_wrong_kind_are_refused():
    with pytest.raises(ValueError, match="expected 'send' lines"):
        check([delivery("c", "p", "g", 1, 100)], [])


def test_load_jsonl_skips_a_torn_last_line_and_refuses_a_broken_one_inside(tmp_path):
    path = tmp_path / "sends.jsonl"
    path.write_text(json.dumps(send("p", "g", 1)) + "\n" + json.dumps(send("p", "g", 2))[:20])
    assert [line["sequence"] for line in load_jsonl(path)] == [1]
    path.write_text("{not json\n" + json.dumps(send("p", "g", 1)) + "\n")
    with pytest.raises(ValueError, match="sends.jsonl:1"):
        load_jsonl([path])


def _write(path, lines) -> str:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return str(path)


def test_the_command_line_prints_the_summary_and_exits_0_or_1(tmp_path, capsys):
    sends, deliveries = clean_run()
    half = len(sends) // 2
    send_paths = [_write(tmp_path / "s1.jsonl", sends[:half]), _write(tmp_path / "s2.jsonl", sends[half:])]
    delivery_path = _write(tmp_path / "d.jsonl", deliveries)
    assert main([*send_paths, "--", delivery_path]) == 0
    assert capsys.readouterr().out.startswith("ok: 12 sends")
    lossy_path = _write(tmp_path / "lossy.jsonl", deliveries[1:])
    assert main(["--sends", *send_paths, "--deliveries", lossy_path]) == 1
    assert "lost: 1" in capsys.readouterr().out
    assert main(["--sends", str(tmp_path / "missing.jsonl"), "--deliveries", delivery_path]) == 2
    assert main(["--sends", *send_paths]) == 2


def test_a_refusal_whose_outcome_is_unknown_may_be_delivered_and_counts_as_a_timeout():
    unknown = {**send("p", "g", 1, "rejected"), "description": "outcome unknown: the node could not store it"}
    report = check([unknown, send("p", "g", 2, "rejected")], [delivery("c", "p", "g", 1, 10)])
    assert report.ok, report.summary()
    assert (report.refused, report.timed_out) == (1, 1)
    assert report.unconfirmed_delivered == [("p", "g", 1)]


def test_a_lost_disk_loses_each_group_from_the_first_message_its_owner_had_not_delivered_and_says_which():
    # disk-loss (issue 28): groups a and b lived on the owner that lost its journal; what their consumer
    # had not accepted by then is gone, while group c (another owner) and the messages after the rejoin arrive
    sends = [send("p", group, sequence) for group in ("a", "b", "c") for sequence in range(1, 7)]
    delivered = {("a", 1), ("a", 2), ("b", 1), *(("c", s) for s in range(1, 7)), ("a", 6), ("b", 6)}
    deliveries = [delivery("c1", "p", group, sequence, 100 + 10 * sequence) for group, sequence in sorted(delivered)]
    report = check(sends, deliveries)
    assert report.lost == [("p", "a", 3), ("p", "a", 4), ("p", "a", 5), ("p", "b", 2), ("p", "b", 3), ("p", "b", 4),
                           ("p", "b", 5)]
    assert not report.order_violations  # a hole in a group is a loss, not a reordering
    assert "lost: 7, e.g. p/a#3" in report.summary()
