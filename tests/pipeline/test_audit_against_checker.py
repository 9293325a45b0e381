"""The Spark audit agrees with tests/drills/checker.py, count for count, on seeded random adversarial logs.

Each case is a tiny drill of its own (its own queues and producers, so cases cannot see each other)
with small clocks, so equal stamps, overlapping holds, drops, unconfirmed acceptances, redeliveries
with and without delivery-count, deliveries after a close (after_close), refused and timed-out sends,
duplicate send lines and foreign messages all occur. Every case goes through ONE audit run (a Spark job costs seconds, a case
nothing), then the checker judges each queue of each case alone and the counts must be equal.
Lines are spread over two files per kind at random, so log order (the tie-breaker of both) crosses
files.
"""

from __future__ import annotations

import json
import random

import pytest

from pipeline import audit
from tests.drills.checker import check

SEED = 20261122
CASES = 150
CLOCK_MS_MAX = 25  # a small clock: many equal stamps
SEND_OUTCOMES = ["accepted"] * 7 + ["rejected", "released", "modified", "timeout"]
DELIVERY_OUTCOMES = ["accepted"] * 7 + ["dropped"] * 2 + ["released", "rejected", "modified"]


def random_case(rng: random.Random, case: int) -> tuple[list[dict], list[dict]]:
    queues = [f"k{case}q0", f"k{case}q1"]
    producers = {f"k{case}p{index}": queues[index % 2] for index in range(3)}
    sends = []
    for producer, queue in producers.items():
        for group in ("a", "b"):
            for sequence in range(1, rng.randint(0, 4) + 1):
                line = {"kind": "send", "producer": producer, "node": "amqp://n", "queue": queue, "group": group,
                        "sequence": sequence, "sent_ms": rng.randint(0, CLOCK_MS_MAX),
                        "outcome": rng.choice(SEND_OUTCOMES), "condition": None}
                line["settled_ms"] = line["sent_ms"] + rng.randint(0, 3)
                sends.append(line)
                if rng.random() < 0.05:  # the same identity logged twice
                    sends.append({**line, "outcome": rng.choice(SEND_OUTCOMES)})
    rng.shuffle(sends)
    identities = [(line["producer"], line["group"], line["sequence"], line["queue"]) for line in sends]
    identities += [(f"k{case}p0", "a", 9, producers[f"k{case}p0"]), (f"k{case}px", "b", 1, queues[0])]  # never sent
    deliveries = []
    for _ in range(rng.randint(0, 14)):
        producer, group, sequence, queue = rng.choice(identities)
        received_ms = rng.randint(0, CLOCK_MS_MAX)
        line = {"kind": "delivery", "consumer": rng.choice(["c0", "c1", "c2"]), "node": "amqp://n", "queue": queue,
                "group": group, "producer": producer, "sequence": sequence, "received_ms": received_ms,
                "settled_ms": received_ms + rng.randint(0, 6), "confirmed_ms": None,
                "delivery_count": rng.choice([0, 0, 0, 1, 2]), "outcome": rng.choice(DELIVERY_OUTCOMES)}
        confirmed = rng.random()
        if confirmed < 0.7:
            line["settle_confirmed"] = True
        elif confirmed < 0.9:
            line["settle_confirmed"] = False
        # else: no settle_confirmed at all, which counts as true
        if rng.random() < 0.1:  # reached a consumer after it closed: both judges leave it out
            line.update(outcome="dropped", settle_confirmed=False, after_close=True)
        elif rng.random() < 0.05:
            line["after_close"] = False
        deliveries.append(line)
    return sends, deliveries


def write_split(rng: random.Random, lines: list[dict], paths) -> list[dict]:
    """Spread lines over the files at random; returns them in log order (file by file)."""
    files = [[] for _ in paths]
    for line in lines:
        rng.choice(files).append(line)
    for path, chunk in zip(paths, files):
        path.write_text("".join(json.dumps(line) + "\n" for line in chunk))
    return [line for chunk in files for line in chunk]


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    rng = random.Random(SEED)
    sends, deliveries = [], []
    for case in range(CASES):
        case_sends, case_deliveries = random_case(rng, case)
        sends += case_sends
        deliveries += case_deliveries
    directory = tmp_path_factory.mktemp("random-logs")
    send_paths = [directory / "sends-0.jsonl", directory / "sends-1.jsonl"]
    delivery_paths = [directory / "deliveries-0.jsonl", directory / "deliveries-1.jsonl"]
    events = [{"kind": "admin", "action": "reset", "queue": "k0q0", "group": None, "at_ms": 5},
              {"kind": "attach", "consumer": "c1", "node": "amqp://n", "queue": "k1q0", "at_ms": 7},
              {"kind": "detach", "consumer": "c0", "node": "amqp://n", "queue": "k2q1", "at_ms": 9,
               "condition": "connection lost"}]
    sends = write_split(rng, sends, send_paths)
    deliveries = write_split(rng, deliveries + events, delivery_paths)
    return send_paths, delivery_paths, sends, [line for line in deliveries if line["kind"] == "delivery"]


def queues_of(sends: list[dict], deliveries: list[dict]) -> list[str]:
    """The queues the audit reports: a line marked after_close is left out, so it names no queue."""
    return sorted({line["queue"] for line in [*sends, *deliveries] if not line.get("after_close")})


def checker_counts(report, sends_logged: bool = True) -> dict:
    counts = {"deliveries": report.deliveries, "delivered": report.delivered, "redeliveries": report.redeliveries,
              "duplicates": len(report.duplicates), "order_violations": len(report.order_violations),
              "exclusivity_violations": len(report.exclusivity_violations)}
    if sends_logged:
        counts.update(sent=report.sends, accepted=report.accepted, refused=report.refused, timed_out=report.timed_out,
                      lost=len(report.lost), refused_delivered=len(report.refused_delivered),
                      unexpected=len(report.unexpected), unconfirmed_delivered=len(report.unconfirmed_delivered))
    return counts


def audit_counts(entry: dict, sends_logged: bool = True) -> dict:
    counts = {"deliveries": entry["deliveries"], "delivered": entry["delivered"],
              "redeliveries": entry["redeliveries"]}
    counts.update({name: entry["verdicts"][name]["count"]
                   for name in ("duplicates", "order_violations", "exclusivity_violations")})
    if sends_logged:
        sent = entry["sent"] or {"lines": 0, "accepted": 0, "refused": 0, "timed_out": 0}
        counts.update(sent=sent["lines"], accepted=sent["accepted"], refused=sent["refused"],
                      timed_out=sent["timed_out"])
        counts.update({name: entry["verdicts"][name]["count"]
                       for name in ("lost", "refused_delivered", "unexpected", "unconfirmed_delivered")})
    return counts


def test_every_count_equals_the_checkers_per_queue(spark, logs):
    send_paths, delivery_paths, sends, deliveries = logs
    report = audit.audit(spark, audit.LogFiles.of(delivery_paths, send_paths))
    by_queue = {entry["queue"]: entry for entry in report["queues"]}
    mismatches, violations_seen = [], 0
    for queue in queues_of(sends, deliveries):
        expected = checker_counts(check([line for line in sends if line["queue"] == queue],
                                        [line for line in deliveries if line["queue"] == queue]))
        actual = audit_counts(by_queue[queue])
        violations_seen += expected["order_violations"] + expected["exclusivity_violations"] + expected["lost"]
        if actual != expected:
            mismatches.append(f"{queue}: checker {expected} audit {actual}")
    assert not mismatches, "\n".join(mismatches[:10])
    assert violations_seen > 100  # the cases are adversarial enough to test something
    assert report["ok"] is False


def test_without_send_logs_the_audit_judges_as_if_every_delivered_message_was_accepted(spark, logs):
    _, delivery_paths, _, deliveries = logs
    report = audit.audit(spark, audit.LogFiles.of(delivery_paths))
    by_queue = {entry["queue"]: entry for entry in report["queues"]}
    assert report["sends_logged"] is False and report["notes"]
    mismatches = []
    for queue in queues_of([], deliveries):
        lines = [line for line in deliveries if line["queue"] == queue]
        assumed = [{"kind": "send", "producer": line["producer"], "group": line["group"], "sequence": line["sequence"],
                    "queue": queue, "outcome": "accepted"} for line in lines]
        expected = checker_counts(check(assumed, lines), sends_logged=False)
        actual = audit_counts(by_queue[queue], sends_logged=False)
        if actual != expected:
            mismatches.append(f"{queue}: checker {expected} audit {actual}")
        assert by_queue[queue]["verdicts"]["lost"] is None
    assert not mismatches, "\n".join(mismatches[:10])
