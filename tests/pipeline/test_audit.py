"""The audit on hand-made logs: one queue per scenario (a clean run, each kind of violation, each reason a
group changes consumer), judged by ONE `grouper audit` run whose JSON, text and PNG every test reads.

The expected counts are written out by hand; the checker's counts on each queue are asserted equal
too. Bad input (a file missing, lines that are not the format) is refused before Spark does any work
worth the name.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys

import pytest

from node.cli import main
from tests.drills.checker import check

Q = "queue"


def send(queue: str, group: str, sequence: int, outcome: str = "accepted", producer: str = "p") -> dict:
    return {"kind": "send", "producer": f"{queue}-{producer}", "node": "amqp://n1", "queue": queue, "group": group,
            "sequence": sequence, "sent_ms": 10 * sequence, "settled_ms": 10 * sequence + 1, "outcome": outcome,
            "condition": None}


def delivery(queue: str, consumer: str, group: str, sequence: int, received_ms: int, settled_ms: int | None = None,
             outcome: str = "accepted", confirmed: bool = True, delivery_count: int = 0, producer: str = "p") -> dict:
    return {"kind": "delivery", "consumer": consumer, "node": "amqp://n1", "queue": queue, "group": group,
            "producer": f"{queue}-{producer}", "sequence": sequence, "received_ms": received_ms,
            "settled_ms": received_ms + 1 if settled_ms is None else settled_ms, "confirmed_ms": None,
            "delivery_count": delivery_count, "outcome": outcome, "settle_confirmed": confirmed}


def event(kind: str, queue: str, at_ms: int, consumer: str | None = None, **fields) -> dict:
    line = {"kind": kind, "queue": queue, "at_ms": at_ms, **fields}
    if consumer is not None:
        line.update(consumer=consumer, node="amqp://n1")
    return line


def clean(queue: str) -> tuple[list[dict], list[dict]]:
    """Groups a and b, three messages each, a to c1 and b to c2, in order."""
    sends = [send(queue, group, sequence) for sequence in (1, 2, 3) for group in ("a", "b")]
    deliveries = [delivery(queue, "c1" if line["group"] == "a" else "c2", line["group"], line["sequence"],
                           100 + 10 * index) for index, line in enumerate(sends)]
    return sends, deliveries


def scenario(name: str) -> tuple[list[dict], list[dict]]:
    sends, lines = clean(name)
    if name == "lost":
        lines = [line for line in lines if (line["group"], line["sequence"]) != ("b", 2)]
    elif name == "duplicate_declared":  # the last message of a, accepted twice, the second time declared
        lines.append(delivery(name, "c1", "a", 3, 200, delivery_count=1))
    elif name == "duplicate_silent":
        lines.append(delivery(name, "c1", "a", 3, 200))
    elif name == "first_acceptances_reordered":  # a#2 arrives before a#1
        lines = [line for line in lines if line["group"] != "a"]
        lines += [delivery(name, "c1", "a", 2, 100), delivery(name, "c1", "a", 1, 110), delivery(name, "c1", "a", 3, 120)]
    elif name == "redelivered_after_later":  # a#1 dropped, a#2 accepted, then a#1 comes back: both rules break
        lines = [line for line in lines if line["group"] != "a"]
        lines += [delivery(name, "c1", "a", 1, 100, outcome="dropped", confirmed=False),
                  delivery(name, "c1", "a", 2, 105, 106), delivery(name, "c1", "a", 1, 130, delivery_count=1),
                  delivery(name, "c1", "a", 3, 140)]
    elif name == "overlap":  # c2 receives a#3 while c1 still holds a#2
        lines = [line for line in lines if line["group"] != "a"]
        lines += [delivery(name, "c1", "a", 1, 100), delivery(name, "c1", "a", 2, 110, 150),
                  delivery(name, "c2", "a", 3, 120, 121)]
    elif name == "refused_delivered":
        sends[0] = {**sends[0], "outcome": "rejected", "condition": "amqp:resource-limit-exceeded"}
    elif name == "unexpected":
        lines.append(delivery(name, "c2", "b", 4, 300))
    elif name == "unconfirmed":  # legal: a send that timed out was taken by the node after all
        sends[1] = {**sends[1], "outcome": "timeout"}
    elif name == "dropped_then_redelivered":  # legal; c1's connection died, c2 gets a#2 again with count 1
        lines = [line for line in lines if line["group"] != "a"]
        lines += [delivery(name, "c1", "a", 1, 100), delivery(name, "c1", "a", 2, 110, outcome="dropped",
                                                               confirmed=False),
                  delivery(name, "c2", "a", 2, 130, delivery_count=1), delivery(name, "c2", "a", 3, 140)]
    elif name == "reasons":  # group a: reset, then c2's detach, then c3's attach, then a change with no cause
        lines = [line for line in lines if line["group"] != "a"]
        sends += [send(name, "a", sequence) for sequence in (4, 5)]
        lines += [delivery(name, "c1", "a", 1, 100), event("admin", name, 105, action="reset", group="a"),
                  delivery(name, "c2", "a", 2, 110), event("detach", name, 115, "c2", condition="connection lost"),
                  delivery(name, "c1", "a", 3, 120), event("attach", name, 125, "c3"),
                  delivery(name, "c3", "a", 4, 130), delivery(name, "c1", "a", 5, 140)]
    elif name == "queue_reset":  # an admin action without a group frees every group of the queue
        lines = [line for line in lines if line["group"] != "b"]
        lines += [delivery(name, "c2", "b", 1, 101), delivery(name, "c2", "b", 2, 160),
                  event("admin", name, 165, action="reset", group=None), delivery(name, "c3", "b", 3, 170)]
    return sends, lines


# name -> the counts it must show (every other verdict 0)
EXPECTED = {
    "clean": {},
    "lost": {"lost": 1},
    "duplicate_declared": {"duplicates": 1},
    "duplicate_silent": {"duplicates": 1},
    "first_acceptances_reordered": {"order_violations": 1},
    "redelivered_after_later": {"order_violations": 2},
    "overlap": {"exclusivity_violations": 1},
    "refused_delivered": {"refused_delivered": 1},
    "unexpected": {"unexpected": 1},
    "unconfirmed": {"unconfirmed_delivered": 1},
    "dropped_then_redelivered": {},
    "reasons": {},
    "queue_reset": {},
}
VERDICTS = ("lost", "duplicates", "order_violations", "exclusivity_violations", "refused_delivered", "unexpected",
            "unconfirmed_delivered")


@pytest.fixture(scope="module")
def audited(spark, tmp_path_factory):
    """Runs `grouper audit` once over every scenario; returns (exit status, report, text, png path, logs)."""
    directory = tmp_path_factory.mktemp("hand-made")
    sends, lines = [], []
    for name in EXPECTED:
        scenario_sends, scenario_lines = scenario(name)
        sends += scenario_sends
        lines += scenario_lines
    (directory / "sends.jsonl").write_text("".join(json.dumps(line) + "\n" for line in sends))
    (directory / "consumers.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path_factory.mktemp("out")
    status = main(["audit", str(directory / "consumers.jsonl"), "--sends", str(directory / "sends.jsonl"),
                   "--json", str(out / "report.json"), "--text", str(out / "summary.txt"),
                   "--png", str(out / "chart.png")])
    report = json.loads((out / "report.json").read_text())
    return status, report, (out / "summary.txt").read_text(), out / "chart.png", (sends, lines)


def queue(report: dict, name: str) -> dict:
    return next(entry for entry in report["queues"] if entry["queue"] == name)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_scenario_shows_exactly_its_violations_and_agrees_with_the_checker(audited, name):
    _, report, _, _, (sends, lines) = audited
    entry = queue(report, name)
    counts = {verdict: entry["verdicts"][verdict]["count"] for verdict in VERDICTS}
    assert counts == {verdict: EXPECTED[name].get(verdict, 0) for verdict in VERDICTS}
    checked = check([line for line in sends if line["queue"] == name],
                    [line for line in lines if line["queue"] == name and line["kind"] == "delivery"])
    assert counts == {verdict: len(getattr(checked, verdict)) for verdict in VERDICTS}
    assert (entry["deliveries"], entry["delivered"], entry["redeliveries"]) == (
        checked.deliveries, checked.delivered, checked.redeliveries)
    broken = [verdict for verdict in VERDICTS[:-1] if counts[verdict]]
    assert entry["broken"] == broken


def test_a_clean_queue_counts_every_message_and_its_spread(audited):
    _, report, _, _, _ = audited
    entry = queue(report, "clean")
    assert entry["sent"] == {"lines": 6, "accepted": 6, "refused": 0, "timed_out": 0}
    assert (entry["deliveries"], entry["delivered"], entry["groups"], entry["consumers"]) == (6, 6, 2, 2)
    assert [(c["consumer"], c["deliveries"], c["groups"]) for c in entry["per_consumer"]] == [("c1", 3, 1), ("c2", 3, 1)]
    assert entry["spread"]["deliveries"] == {"min": 3, "max": 3, "mean": 3.0, "max_over_mean": 1.0}
    assert entry["consumer_changes"] == {"changes": 0, "groups": 0, "by_reason": {}}
    # sent at 10 * sequence, received at 100 + 10 * index: 90, 100, 100, 110, 110, 120 ms
    assert entry["latency_ms"]["send_to_receive"] == {"p50": 100, "p90": 120, "p99": 120, "max": 120}
    assert entry["latency_ms"]["receive_to_settle"] == {"p50": 1, "p90": 1, "p99": 1, "max": 1}


def test_duplicates_say_how_many_were_declared_redeliveries(audited):
    _, report, _, _, _ = audited
    assert queue(report, "duplicate_declared")["duplicates_declared"] == 1
    assert queue(report, "duplicate_silent")["duplicates_declared"] == 0
    assert queue(report, "duplicate_silent")["verdicts"]["duplicates"]["examples"] == ["duplicate_silent-p/a#3"]


def test_overlapping_holds_name_the_group_and_both_consumers(audited):
    _, report, _, _, _ = audited
    verdict = queue(report, "overlap")["verdicts"]["exclusivity_violations"]
    assert verdict["groups"] == 1
    assert verdict["examples"] == ["overlap/a: c2 received overlap-p/a#3 at 120 while c1 held the group until 150"]


def test_each_change_of_consumer_gets_its_reason(audited):
    _, report, _, _, _ = audited
    changes = queue(report, "reasons")["consumer_changes"]
    assert (changes["changes"], changes["groups"]) == (4, 1)
    assert {reason: entry["count"] for reason, entry in changes["by_reason"].items()} == {
        "reset": 1, "consumer_gone": 1, "rebalance": 1, "unexplained": 1}
    assert changes["by_reason"]["rebalance"]["examples"] == ["reasons/a: c1 -> c3 at 130"]
    queue_wide = queue(report, "queue_reset")["consumer_changes"]["by_reason"]
    assert {reason: entry["count"] for reason, entry in queue_wide.items()} == {"reset": 1}
    dropped = queue(report, "dropped_then_redelivered")["consumer_changes"]["by_reason"]
    assert {reason: entry["count"] for reason, entry in dropped.items()} == {"consumer_gone": 1}


def test_a_broken_invariant_exits_1_and_the_outputs_say_which(audited):
    status, report, text, png, _ = audited
    assert status == 1 and report["ok"] is False
    assert report["broken"] == [f"{name}: {verdict}" for name in sorted(EXPECTED) for verdict in VERDICTS[:-1]
                                if EXPECTED[name].get(verdict)]
    assert text.startswith("audit FAILED: 13 queues")
    assert "queue lost: FAILED (lost)" in text and "lost, e.g. lost-p/b#2" in text
    assert "queue clean: ok" in text
    header = png.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    assert width > 800 and height > 600


def test_unreadable_logs_exit_2_naming_the_file(tmp_path, capsys):
    assert main(["audit", str(tmp_path / "missing.jsonl")]) == 2
    assert "missing.jsonl: no such file" in capsys.readouterr().err
    garbled = tmp_path / "garbled.jsonl"
    garbled.write_text('{"kind": "delivery"\nnot json\n{"kind": "delivery", "queue": "q"}\n')
    assert main(["audit", str(garbled)]) == 2
    assert "garbled.jsonl: 2 lines are not JSON objects" in capsys.readouterr().err
    assert main(["audit", str(garbled), "--driver-memory", "lots"]) == 2


def test_grouper_without_audit_never_loads_spark():
    code = ("import sys; from node.cli import build_parser; build_parser(); "
            "print(sorted(m for m in sys.modules if m.startswith(('pyspark', 'matplotlib'))))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "[]"
