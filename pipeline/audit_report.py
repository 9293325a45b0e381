"""The audit's report: plain data assembled from the Spark job's small aggregates, its invariants and its text.

Pure: no Spark, no files but the one `write_json` is given. A report is a dict that json.dumps can
write as it is. The invariants are the checker's (tests/drills/checker.py): a queue breaks one when
it has any lost message, duplicate, order violation, overlapping hold (exclusivity), delivered
refused send or delivered message that no producer logged. Declared duplicates, unconfirmed
deliveries and consumer changes are reported, never judged.
"""

from __future__ import annotations

import json
from pathlib import Path

INVARIANTS = ("lost", "duplicates", "order_violations", "exclusivity_violations", "refused_delivered", "unexpected")
NEED_SENDS = ("lost", "refused_delivered", "unexpected", "unconfirmed_delivered")
REPORTED = ("unconfirmed_delivered",)  # legal, counted only
PERCENTILE_NAMES = ("p50", "p90", "p99")
NO_SENDS_NOTE = ("no send logs: lost, refused_delivered, unexpected and unconfirmed_delivered are not judged and "
                 "send-to-receive latency is unknown; every delivered message is taken as accepted by the node, "
                 "so the order checks still run")
EXAMPLES_SHOWN = 3  # per verdict in the text summary
CONSUMERS_SHOWN = 12  # per queue in the text summary


def assemble(*, files, kinds: dict, sends_logged: bool, delivery_stats: list, identity_stats: list, sends: list,
             findings: list) -> dict:
    """The report from the job's aggregates: rows of rollups by (queue, consumer) (`level` 0) and by
    queue (`level` 1), send counts per queue, and findings counted per (finding, queue)."""
    names = sorted({row["queue"] for row in [*delivery_stats, *identity_stats, *sends]})
    by_queue = {name: _queue_skeleton(name, sends_logged) for name in names}
    send_latency = {}
    for row in identity_stats:
        if row["level"] == 1:
            by_queue[row["queue"]].update(identities_delivered=row["identities_delivered"],
                                          delivered=row["delivered"])
            by_queue[row["queue"]]["latency_ms"]["send_to_receive"] = _latency(row, "send_to_receive_ms")
        elif row["consumer"] is not None:
            send_latency[(row["queue"], row["consumer"])] = _latency(row, "send_to_receive_ms")
    for row in sorted(delivery_stats, key=lambda row: (row["queue"], str(row["consumer"]))):
        entry = by_queue[row["queue"]]
        if row["level"] == 1:
            entry.update(deliveries=row["deliveries"], redeliveries=row["redeliveries"], groups=row["groups"],
                         consumers=sum(1 for other in delivery_stats
                                       if other["queue"] == row["queue"] and other["level"] == 0))
            entry["latency_ms"]["receive_to_settle"] = _latency(row, "receive_to_settle_ms")
        else:
            entry["per_consumer"].append({
                "consumer": row["consumer"], "deliveries": row["deliveries"], "accepted": row["accepted"],
                "groups": row["groups"], "receive_to_settle_ms": _latency(row, "receive_to_settle_ms"),
                "send_to_receive_ms": send_latency.get((row["queue"], row["consumer"]))})
    for row in sends:
        by_queue[row["queue"]]["sent"] = {key: row[key] for key in ("lines", "accepted", "refused", "timed_out")}
    for row in findings:
        entry, finding = by_queue[row["queue"]], row["finding"]
        counted = {"count": row["count"], "groups": row["groups"], "examples": row["examples"] or []}
        if finding == "duplicates_declared":
            entry["duplicates_declared"] = row["count"]
        elif finding == "change":
            entry["consumer_changes"].update(changes=row["count"], groups=row["groups"])
        elif finding.startswith("change:"):
            entry["consumer_changes"]["by_reason"][finding.split(":", 1)[1]] = counted
        else:
            entry["verdicts"][finding] = counted
    for entry in by_queue.values():
        entry["consumer_changes"]["by_reason"] = dict(sorted(entry["consumer_changes"]["by_reason"].items()))
        entry["spread"] = {"deliveries": _spread([c["deliveries"] for c in entry["per_consumer"]]),
                           "groups": _spread([c["groups"] for c in entry["per_consumer"]])}
        entry["broken"] = [name for name in INVARIANTS if (entry["verdicts"].get(name) or {}).get("count")]
    broken = [f"{entry['queue']}: {name}" for entry in by_queue.values() for name in entry["broken"]]
    return {
        "ok": not broken,
        "broken": broken,
        "sends_logged": sends_logged,
        "notes": [] if sends_logged else [NO_SENDS_NOTE],
        "files": {"sends": [str(path) for path in files.send_paths], "logs": [str(path) for path in files.log_paths]},
        "lines": dict(sorted(kinds.items())),
        "totals": _totals(list(by_queue.values()), sends_logged),
        "queues": list(by_queue.values()),
    }


def _queue_skeleton(name: str, sends_logged: bool) -> dict:
    verdicts = {name: {"count": 0, "groups": 0, "examples": []} for name in (*INVARIANTS, *REPORTED)}
    if not sends_logged:
        verdicts.update({name: None for name in NEED_SENDS})
    return {"queue": name, "sent": None, "deliveries": 0, "redeliveries": 0, "identities_delivered": 0,
            "delivered": 0, "groups": 0, "consumers": 0, "verdicts": verdicts, "duplicates_declared": 0,
            "consumer_changes": {"changes": 0, "groups": 0, "by_reason": {}},
            "latency_ms": {"send_to_receive": None, "receive_to_settle": None}, "per_consumer": []}


def _latency(row: dict, name: str) -> dict | None:
    values = row.get(name)
    if values is None:
        return None
    return {**dict(zip(PERCENTILE_NAMES, values)), "max": row[f"{name}_max"]}


def _spread(values: list[int]) -> dict | None:
    if not values:
        return None
    mean = sum(values) / len(values)
    return {"min": min(values), "max": max(values), "mean": round(mean, 2),
            "max_over_mean": round(max(values) / mean, 3) if mean else None}


def _totals(queues: list[dict], sends_logged: bool) -> dict:
    totals = {key: sum(queue[key] for queue in queues)
              for key in ("deliveries", "redeliveries", "identities_delivered", "delivered", "duplicates_declared")}
    totals["sent"] = sum(queue["sent"]["lines"] for queue in queues if queue["sent"]) if sends_logged else None
    for name in (*INVARIANTS, *REPORTED):
        counts = [queue["verdicts"][name]["count"] for queue in queues if queue["verdicts"][name] is not None]
        totals[name] = sum(counts) if sends_logged or name not in NEED_SENDS else None
    totals["consumer_changes"] = sum(queue["consumer_changes"]["changes"] for queue in queues)
    return totals


def write_json(report: dict, path: Path) -> None:
    path.write_text(json.dumps(report, indent=2, sort_keys=False) + "\n")


# ---- the text summary ------------------------------------------------------------------------------

def _n(value) -> str:
    return "-" if value is None else f"{value:,}"


def _latency_text(latency: dict | None) -> str:
    if latency is None:
        return "-"
    return " ".join(f"{name} {_n(latency[name])}" for name in (*PERCENTILE_NAMES, "max"))


def summary(report: dict) -> str:
    totals = report["totals"]
    head = (f"audit {'ok' if report['ok'] else 'FAILED'}: {len(report['queues'])} queues, "
            f"{_n(totals['deliveries'])} deliveries, {_n(totals['sent'])} sends")
    lines = [head + (f"; broken: {', '.join(report['broken'])}" if report["broken"] else "")]
    lines += [f"note: {note}" for note in report["notes"]]
    if report["lines"].get("malformed"):
        lines.append(f"note: {report['lines']['malformed']} torn last line(s) skipped")
    for queue in report["queues"]:
        lines += [""] + _queue_text(queue)
    return "\n".join(lines)


def _queue_text(queue: dict) -> list[str]:
    sent = queue["sent"]
    sent_text = (f"sent {_n(sent['lines'])} (accepted {_n(sent['accepted'])}, refused {_n(sent['refused'])}, "
                 f"timed out {_n(sent['timed_out'])}); " if sent else "")
    verdicts = queue["verdicts"]

    def count(name: str) -> str:
        return "-" if verdicts[name] is None else _n(verdicts[name]["count"])
    changes = queue["consumer_changes"]
    reasons = ", ".join(f"{reason} {_n(entry['count'])}" for reason, entry in sorted(changes["by_reason"].items()))
    lines = [
        f"queue {queue['queue']}: {'FAILED (' + ', '.join(queue['broken']) + ')' if queue['broken'] else 'ok'}",
        f"  {sent_text}deliveries {_n(queue['deliveries'])} ({_n(queue['delivered'])} messages accepted by a "
        f"consumer, {_n(queue['redeliveries'])} redeliveries)",
        f"  lost {count('lost')} | duplicates {count('duplicates')} ({_n(queue['duplicates_declared'])} declared "
        f"redeliveries) | order violations {count('order_violations')} | overlapping holds "
        f"{count('exclusivity_violations')} in {_n((verdicts['exclusivity_violations'] or {}).get('groups'))} groups "
        f"| refused delivered {count('refused_delivered')} | unexpected {count('unexpected')} | unconfirmed "
        f"delivered (legal) {count('unconfirmed_delivered')}",
        f"  {_n(queue['groups'])} groups over {_n(queue['consumers'])} consumers; {_n(changes['groups'])} groups "
        f"changed consumer {_n(changes['changes'])} times" + (f" ({reasons})" if reasons else ""),
        f"  latency ms: send->receive {_latency_text(queue['latency_ms']['send_to_receive'])}; "
        f"receive->settle {_latency_text(queue['latency_ms']['receive_to_settle'])}",
    ]
    for name in INVARIANTS:
        verdict = verdicts[name]
        if verdict and verdict["count"]:
            lines.append(f"  {name.replace('_', ' ')}, e.g. " + "; ".join(verdict["examples"][:EXAMPLES_SHOWN]))
    consumers = sorted(queue["per_consumer"], key=lambda c: -c["deliveries"])
    if consumers:
        lines.append(f"  {'consumer':<16} {'deliveries':>11} {'groups':>8} {'settle p50/p99 ms':>18} "
                     f"{'send->receive p50/p99 ms':>25}")
        for consumer in consumers[:CONSUMERS_SHOWN]:
            settle, send = consumer["receive_to_settle_ms"], consumer["send_to_receive_ms"]
            lines.append(f"  {str(consumer['consumer']):<16} {_n(consumer['deliveries']):>11} "
                         f"{_n(consumer['groups']):>8} "
                         f"{(_n(settle['p50']) + '/' + _n(settle['p99'])) if settle else '-':>18} "
                         f"{(_n(send['p50']) + '/' + _n(send['p99'])) if send else '-':>25}")
        if len(consumers) > CONSUMERS_SHOWN:
            lines.append(f"  ... and {len(consumers) - CONSUMERS_SHOWN} more consumers (see the JSON report)")
    return lines
