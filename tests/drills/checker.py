"""Judges a drill's delivery logs against what grouped queues promise. Pure: no proton, no clock.

The logs are JSON lines, one object a line, written by tests/drills/load.py (any client may write them).

  send, one line per send outcome:
    {"kind": "send", "producer": str, "node": str (the AMQP url sent to), "queue": str, "group": str,
     "sequence": int (per producer and group, from 1), "sent_ms": int, "settled_ms": int,
     "outcome": "accepted" | "rejected" | "released" | "modified" | "timeout", "condition": str | null,
     "description": str (optional: the refusal's condition description)}
  delivery, one line per delivery to a consumer, written once its fate is known:
    {"kind": "delivery", "consumer": str, "node": str, "queue": str, "group": str, "producer": str,
     "sequence": int, "received_ms": int, "settled_ms": int, "confirmed_ms": int | null,
     "delivery_count": int, "outcome": "accepted" | "released" | "modified" | "rejected" | "dropped",
     "settle_confirmed": bool}

A message's identity is (producer, group, sequence); a producer name sends to one queue. Times are
wall-clock milliseconds of one machine. `received_ms` is stamped after the message reached the
client and `settled_ms` before the consumer's outcome left it, so client-side delays only ever
shrink what the node is blamed for, and equal stamps never prove a violation.

Words:
- A *confirmed acceptance* is a delivery accepted with `settle_confirmed` true: the consumer left
  it unsettled (rcv-settle-mode second) and saw the node settle it, so the node has removed the
  message for good. An *unconfirmed* acceptance (the connection dropped first) may or may not have
  reached the node. `settle_confirmed` missing counts as true.
- *dropped*: the connection died before the consumer chose an outcome; the node gives it back.
  With "after_close": true (optional, default false) it reached the consumer after the consumer had
  closed its connection: the node sent it before it saw the close and takes back all that was
  unsettled then, so the consumer never held it, and such a line is left out of every verdict (its
  client-side stamp comes after the close, perhaps after another consumer got the message again).
- A *redelivery* is a delivery of an identity that was delivered before (by received_ms), or one
  with delivery_count > 0. A node restarted from its journal may redeliver with delivery_count 0.

Verdicts (each a list of examples, sorted; `ok` needs all but the last to be empty):
- lost: identities whose send was accepted and that no consumer accepted, confirmed or not (an
  unconfirmed acceptance that did not take would have come back).
- duplicates: identities accepted with confirmation twice, or received again strictly after a
  confirmed acceptance. Redelivery after a drop or an unconfirmed acceptance is legal.
- order_violations, per (queue, group, producer), over identities whose send was accepted:
  (a) each identity's first acceptance, ordered by received_ms, comes in increasing sequence;
  (b) a redelivery of sequence s is never received after a confirmed acceptance of a later
      sequence t > s of the same producer in that group was sent.
  Both assume consumers settle in arrival order, as LoggingConsumer does. A consumer that hands a
  message back while the group's next one is already on its way to it may legitimately see the two
  swapped; such consumers are outside this check.
- exclusivity_violations, per (queue, group): the hold intervals [received_ms, settled_ms] of two
  different consumers overlap. Only confirmed deliveries count: a delivery whose connection died
  was held until the node noticed, a moment the client cannot see.
- refused_delivered: identities delivered although the node refused their send.
- unexpected: identities delivered that no producer logged a send for.
- unconfirmed_delivered (legal, reported only): identities delivered whose send timed out; the
  node may well have taken them before the connection died. A refusal whose description starts
  with "outcome unknown" (a consumer had the message before the node's journal write failed) counts
  as such a timeout, not as a refusal: the node said it may be delivered.
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, NamedTuple

EXAMPLES_MAX = 5  # examples of each verdict named by summary()
REFUSED_OUTCOMES = ("rejected", "released", "modified")
OUTCOME_UNKNOWN_PREFIX = "outcome unknown"  # a refusal saying this may be delivered: judged as a timeout

Identity = tuple  # (producer, group, sequence)


class OrderViolation(NamedTuple):
    queue: str
    group: str
    producer: str
    sequence: int
    after_sequence: int  # the later sequence it came after
    rule: str

    def __str__(self) -> str:
        return f"{self.queue}/{self.group}/{self.producer}: #{self.sequence} {self.rule} #{self.after_sequence}"


class Hold(NamedTuple):
    consumer: str
    producer: str
    sequence: int
    received_ms: int
    settled_ms: int

    def __str__(self) -> str:
        return f"{self.consumer} held {self.producer}#{self.sequence} [{self.received_ms}, {self.settled_ms}]"


class Overlap(NamedTuple):
    queue: str
    group: str
    earlier: Hold
    later: Hold

    def __str__(self) -> str:
        return f"{self.queue}/{self.group}: {self.earlier} while {self.later}"


@dataclass(frozen=True)
class Report:
    sends: int
    accepted: int  # sends the node accepted
    refused: int  # sends rejected, released or modified
    timed_out: int  # sends whose outcome never came
    deliveries: int
    delivered: int  # identities some consumer accepted
    redeliveries: int
    lost: list
    duplicates: list
    order_violations: list
    exclusivity_violations: list
    refused_delivered: list
    unexpected: list
    unconfirmed_delivered: list

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicates or self.order_violations or self.exclusivity_violations
                    or self.refused_delivered or self.unexpected)

    def summary(self) -> str:
        lines = [f"{'ok' if self.ok else 'FAILED'}: {self.sends} sends ({self.accepted} accepted, "
                 f"{self.refused} refused, {self.timed_out} timed out); {self.deliveries} deliveries "
                 f"({self.delivered} identities accepted, {self.redeliveries} redeliveries, "
                 f"{len(self.unconfirmed_delivered)} delivered whose send timed out)"]
        for name in ("lost", "duplicates", "order_violations", "exclusivity_violations", "refused_delivered",
                     "unexpected"):
            examples = getattr(self, name)
            if examples:
                shown = ", ".join(_describe(example) for example in examples[:EXAMPLES_MAX])
                more = f" and {len(examples) - EXAMPLES_MAX} more" if len(examples) > EXAMPLES_MAX else ""
                lines.append(f"{name.replace('_', ' ')}: {len(examples)}, e.g. {shown}{more}")
        return "\n".join(lines)


def _describe(example) -> str:
    if isinstance(example, tuple) and not hasattr(example, "_fields"):
        producer, group, sequence = example
        return f"{producer}/{group}#{sequence}"
    return str(example)


def identity(line: dict) -> Identity:
    return (line["producer"], line["group"], line["sequence"])


def _sort_key(key: tuple) -> tuple:
    # a foreign message logs null for its producer, group or sequence: sort those first, never fail
    return tuple((value is not None, value if isinstance(value, int) else str(value)) for value in key)


def _confirmed(line: dict) -> bool:
    return line.get("settle_confirmed", True)


def _confirmed_acceptance(line: dict) -> bool:
    return line["outcome"] == "accepted" and _confirmed(line)


def _outcome(line: dict) -> str:
    if line["outcome"] in REFUSED_OUTCOMES and (line.get("description") or "").startswith(OUTCOME_UNKNOWN_PREFIX):
        return "timeout"
    return line["outcome"]


def check(sends: list[dict], deliveries: list[dict]) -> Report:
    _expect_kind(sends, "send")
    _expect_kind(deliveries, "delivery")
    deliveries = [line for line in deliveries if not line.get("after_close", False)]
    sends = [{**line, "outcome": _outcome(line)} for line in sends]
    send_outcomes = _send_outcomes(sends)
    accepted_sends = {key for key, outcome in send_outcomes.items() if outcome == "accepted"}
    by_identity: dict[Identity, list[dict]] = defaultdict(list)
    for line in sorted(deliveries, key=lambda line: line["received_ms"]):  # stable: log order breaks ties
        by_identity[identity(line)].append(line)
    consumer_accepted = {key for key, lines in by_identity.items()
                         if any(line["outcome"] == "accepted" for line in lines)}
    redeliveries = [line for lines in by_identity.values() for index, line in enumerate(lines)
                    if index > 0 or line.get("delivery_count", 0) > 0]
    delivered_sends = [(key, send_outcomes.get(key)) for key in sorted(by_identity, key=_sort_key)]
    return Report(
        sends=len(sends),
        accepted=sum(1 for line in sends if line["outcome"] == "accepted"),
        refused=sum(1 for line in sends if line["outcome"] in REFUSED_OUTCOMES),
        timed_out=sum(1 for line in sends if line["outcome"] == "timeout"),
        deliveries=len(deliveries),
        delivered=len(consumer_accepted),
        redeliveries=len(redeliveries),
        lost=sorted(accepted_sends - consumer_accepted, key=_sort_key),
        duplicates=[key for key in sorted(by_identity, key=_sort_key) if _duplicated(by_identity[key])],
        order_violations=(_first_acceptances_out_of_order(by_identity, accepted_sends)
                          + _redeliveries_after_later_acceptances(by_identity, accepted_sends, redeliveries)),
        exclusivity_violations=_overlapping_holds(deliveries),
        refused_delivered=[key for key, outcome in delivered_sends if outcome in REFUSED_OUTCOMES],
        unexpected=[key for key, outcome in delivered_sends if outcome is None],
        unconfirmed_delivered=[key for key, outcome in delivered_sends if outcome == "timeout"],
    )


def _expect_kind(lines: list[dict], kind: str) -> None:
    for line in lines:
        if line.get("kind") != kind:
            raise ValueError(f"expected {kind!r} lines, got {line!r}")


def _send_outcomes(sends: list[dict]) -> dict[Identity, str]:
    # a producer logs each identity once; should one appear twice, the node's acceptance wins
    outcomes: dict[Identity, str] = {}
    for line in sends:
        key = identity(line)
        if outcomes.get(key) != "accepted":
            outcomes[key] = line["outcome"]
    return outcomes


def _duplicated(lines: list[dict]) -> bool:
    confirmed = [line for line in lines if _confirmed_acceptance(line)]
    if len(confirmed) > 1:
        return True
    return bool(confirmed) and any(line["received_ms"] > confirmed[0]["received_ms"] for line in lines)


def _first_acceptances_out_of_order(by_identity: dict, accepted_sends: set) -> list[OrderViolation]:
    streams: dict[tuple, list[tuple[int, int]]] = defaultdict(list)  # (queue, group, producer) -> (ms, seq)
    for key, lines in by_identity.items():
        first = next((line for line in lines if line["outcome"] == "accepted"), None)
        if key in accepted_sends and first is not None:
            streams[(first["queue"], first["group"], first["producer"])].append(
                (first["received_ms"], first["sequence"]))
    violations = []
    for (queue, group, producer), stream in sorted(streams.items()):
        highest = 0
        for _, sequence in sorted(stream):  # equal stamps sort by sequence: a tie proves nothing
            if sequence < highest:
                violations.append(OrderViolation(queue, group, producer, sequence, highest,
                                                 "first accepted after"))
            highest = max(highest, sequence)
    return violations


def _redeliveries_after_later_acceptances(by_identity: dict, accepted_sends: set,
                                          redeliveries: list[dict]) -> list[OrderViolation]:
    # per stream: confirmed acceptances sorted by when they were sent, with the running highest sequence
    acceptances: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    for key, lines in by_identity.items():
        for line in lines:
            if key in accepted_sends and _confirmed_acceptance(line):
                acceptances[(line["queue"], line["group"], line["producer"])].append(
                    (line["settled_ms"], line["sequence"]))
    highest_by_stream = {}
    for stream, pairs in acceptances.items():
        pairs.sort()
        highest, running = [], 0
        for _, sequence in pairs:
            running = max(running, sequence)
            highest.append(running)
        highest_by_stream[stream] = ([settled_ms for settled_ms, _ in pairs], highest)
    violations = []
    for line in redeliveries:
        stream = (line["queue"], line["group"], line["producer"])
        if identity(line) not in accepted_sends or stream not in highest_by_stream:
            continue
        settled, highest = highest_by_stream[stream]
        before = bisect.bisect_left(settled, line["received_ms"])  # acceptances sent strictly earlier
        if before and highest[before - 1] > line["sequence"]:
            violations.append(OrderViolation(*stream, line["sequence"], highest[before - 1],
                                             "redelivered after the acceptance of"))
    return sorted(set(violations))


def _overlapping_holds(deliveries: list[dict]) -> list[Overlap]:
    holds: dict[tuple, list[Hold]] = defaultdict(list)
    for line in deliveries:
        if _confirmed(line) and line["outcome"] != "dropped" and line.get("settled_ms") is not None:
            holds[(line["queue"], line["group"])].append(Hold(line["consumer"], line["producer"], line["sequence"],
                                                              line["received_ms"], line["settled_ms"]))
    violations = []
    for (queue, group), group_holds in sorted(holds.items(), key=lambda item: _sort_key(item[0])):
        latest: dict[str, Hold] = {}  # consumer -> its hold that ends last, among those started so far
        for hold in sorted(group_holds, key=lambda h: (h.received_ms, h.settled_ms)):
            clash = next((other for consumer, other in sorted(latest.items())
                          if consumer != hold.consumer and other.settled_ms > hold.received_ms), None)
            if clash is not None:
                violations.append(Overlap(queue, group, clash, hold))
            if hold.consumer not in latest or latest[hold.consumer].settled_ms < hold.settled_ms:
                latest[hold.consumer] = hold
    return violations


# ---- files and the command line ----------------------------------------------------------------

def load_jsonl(paths: str | Path | Iterable[str | Path]) -> list[dict]:
    """Every line of the files, in order. A last line cut short (its writer was killed) is skipped."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    lines = []
    for path in paths:
        text = Path(path).read_text()
        rows = text.split("\n")
        for number, row in enumerate(rows, 1):
            if not row.strip():
                continue
            try:
                lines.append(json.loads(row))
            except json.JSONDecodeError as error:
                if number == len(rows):  # no newline after it: a torn write
                    continue
                raise ValueError(f"{path}:{number}: not a JSON object: {error}") from None
    return lines


def check_files(send_paths: Iterable[str | Path], delivery_paths: Iterable[str | Path]) -> Report:
    return check(load_jsonl(list(send_paths)), load_jsonl(list(delivery_paths)))


def main(argv: list[str] | None = None) -> int:
    """`checker SENDS... -- DELIVERIES...` or `checker --sends SENDS... --deliveries DELIVERIES...`;
    exit 0 when the logs pass, 1 when they show a violation, 2 on bad usage."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv and not any(arg in ("--sends", "--deliveries") for arg in argv):
        split = argv.index("--")
        argv = ["--sends", *argv[:split], "--deliveries", *argv[split + 1:]]
    parser = argparse.ArgumentParser(prog="python -m tests.drills.checker", description=main.__doc__)
    parser.add_argument("--sends", nargs="+", required=True, help="producer logs (JSON lines)")
    parser.add_argument("--deliveries", nargs="+", required=True, help="consumer logs (JSON lines)")
    try:
        arguments = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    try:
        report = check_files(arguments.sends, arguments.deliveries)
    except (OSError, ValueError, KeyError) as error:
        print(f"checker: cannot read the logs: {error}", file=sys.stderr)
        return 2
    print(report.summary())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
