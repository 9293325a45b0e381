"""Run the grouped workload against Grouper and its peers and write docs/benchmarks.md.

    python -m bench.run [--systems grouper,rabbitmq,activemq] [--messages N] [--quick]

Every broker is started first and warmed up (a JVM ~100k messages); then the rows are interleaved:
each row of the matrix (groups x prefetch x durable, 1 producer, 4 consumers) runs on every system
in turn, the systems' order rotating from row to row, so that the machine's load (it is shared) falls
on all of them alike. Only one broker carries traffic at a time. Last come the paced rows: the
producer held to half of the system's own maximum rate, for latency. With `--security yes` (the
default, when Grouper runs) a second Grouper node with a users file and a TLS certificate runs the
1,000-group, prefetch-100 rows over TLS with SASL PLAIN, interleaved with the plain node's same rows,
and the report gives the broker CPU TLS adds per message. A system that cannot start,
or a row that stalls, is reported as failed with the reason: numbers are only ever measured ones.
This module owns the matrix and the report; peers.py owns brokers, clients.py and lean.py own
message traffic.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import platform
import shlex
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from bench import clients, peers
from bench.report_file import copied_text, write_keeping_others
from node.tools.progress import Progress

REPO_ROOT = peers.REPO_ROOT
DEFAULT_OUT = REPO_ROOT / "docs" / "benchmarks.md"
DEFAULT_JSON = REPO_ROOT / "bench" / "results" / "last-run.json"
SYSTEMS = ("grouper", "rabbitmq", "activemq")
VARIANTS = {
    "grouper": ("grouper",),
    "grouper-tls": ("grouper-tls",),  # run with grouper when --security yes; not a --systems choice
    "rabbitmq": ("rabbitmq-queue", "rabbitmq-hash-sac"),
    "activemq": ("activemq",),
}
LABELS = {
    "grouper": "Grouper, exclusive groups (AMQP 1.0)",
    "grouper-tls": "Grouper over TLS, SASL PLAIN (AMQP 1.0)",
    "rabbitmq-queue": "RabbitMQ plain queue, no groups (AMQP 1.0)",
    "rabbitmq-hash-sac": "RabbitMQ hash exchange + 4 SAC queues (AMQP 1.0)",
    "activemq": "ActiveMQ Classic, JMSXGroupID (STOMP)",
}
GROUP_AWARE = {"grouper", "grouper-tls", "rabbitmq-hash-sac", "activemq"}
# ActiveMQ measured ~61 us/msg of broker CPU warm against 131-170 cold: a JIT needs ~100k messages
WARMUP_MESSAGES = {"grouper": 20_000, "grouper-tls": 20_000, "rabbitmq": 20_000, "activemq": 100_000}
CONSUMERS = 4
PACED_FRACTION = 0.5  # paced rows send at this fraction of the system's maximum rate (its unpaced row)
PACED_KEY = (1000, 100, False)  # the unpaced row whose throughput sets the pace
SECURITY_KEYS = ((1000, 100, False), (1000, 100, True))  # (groups, prefetch, durable) of the security rows
# the targets for Grouper ("Ten times cheaper per message")
TARGET_CPU_US = {False: 35, True: 50}  # broker CPU per message, 1000 groups, prefetch 100, by durable
TARGET_CPU_VS_ACTIVEMQ = 0.5
TARGET_PREFETCH_1_VS_100 = 2.0
TARGET_THROUGHPUT_PER_S = 25_000
TARGET_PACED_P99_MS = 5.0


@dataclass(frozen=True)
class Row:
    variant: str
    groups: int
    prefetch: int
    durable: bool
    messages: int
    consumers: int = CONSUMERS
    warmup: bool = False
    rate_per_s: int = 0  # paced rows: the producer's send rate; 0 sends as fast as the broker lets it
    paced: bool = False

    @property
    def system(self) -> str:
        return next(system for system, variants in VARIANTS.items() if self.variant in variants)

    @property
    def queue(self) -> str:
        kind = "warmup" if self.warmup else f"g{self.groups}-p{self.prefetch}-{'d' if self.durable else 'n'}"
        return f"bench-{self.variant}-{kind}{'-paced' if self.paced else ''}"

    def key(self) -> tuple:
        return (self.groups, self.prefetch, self.durable)


def matrix(variants, messages: int, groups_list, prefetch_list, durable_list, probe_groups: int) -> list[Row]:
    rows = [Row(variant, groups, prefetch, durable, messages)
            for variant in variants for groups in groups_list for prefetch in prefetch_list
            for durable in durable_list]
    if probe_groups:  # ordering probe: more groups than ActiveMQ's default group map holds (1024)
        rows += [Row(variant, probe_groups, max(prefetch_list), False, messages) for variant in variants]
    return rows


def security_rows(rows: list[Row], messages: int) -> list[Row]:
    """The secured node's rows: the SECURITY_KEYS among the matrix's Grouper rows."""
    keys = [key for key in SECURITY_KEYS if any(row.variant == "grouper" and row.key() == key for row in rows)]
    return [Row("grouper-tls", groups, prefetch, durable, messages) for groups, prefetch, durable in keys]


def paced_rows(variants, messages: int) -> list[Row]:
    groups, prefetch, durable = PACED_KEY
    return [Row(variant, groups, prefetch, durable, messages, paced=True) for variant in variants]


def run_interleaved(systems: list[str], rows: list[Row], paced: list[Row], warmup_messages: dict, work_dir: Path,
                    consumer_processes: int, log, progress: Progress) -> tuple[list[dict], dict]:
    """Start and warm every system, then run each row on every system in turn (see the header); `progress`
    counts the messages of the warm-ups and rows done."""
    started, versions, results = {}, {}, []
    try:
        for system in systems:
            peer, failure = _start(system, [row for row in rows + paced if row.system == system],
                                   warmup_messages[system], work_dir, log)
            versions.update(_versions(peer, system))
            if failure:
                results += [_failed(row, failure) for row in rows + paced if row.system == system]
            else:
                started[system] = peer
        for system, peer in started.items():
            warmup = Row(VARIANTS[system][0], 1000, 100, False, warmup_messages[system], warmup=True)
            result = _run_row(peer, warmup, work_dir, consumer_processes, log)
            progress.advance(warmup.messages)
            log(f"[{system}] warm-up, {warmup.messages:,} messages: {result['throughput_per_s']:.0f} msgs/s, "
                f"broker {result['broker_cpu_us_per_msg']:.0f} us/msg {result['errors'] or ''}")
        order = list(started)
        keys = list(dict.fromkeys(row.key() for row in rows))
        for number, key in enumerate(keys):
            turn = order[number % len(order):] + order[:number % len(order)] if order else []
            for system in turn:
                for row in (row for row in rows if row.key() == key and row.system == system):
                    progress.note(f"{row.variant}, {row.groups} groups, prefetch {row.prefetch}")
                    results.append(_measured(started[system], row, work_dir, consumer_processes, log))
                    progress.advance(row.messages)
        for system in order:
            for row in (row for row in paced if row.system == system):
                rate = _paced_rate(results, row.variant)
                if not rate:
                    results.append(_failed(row, "no unpaced row to take the pace from"))
                    continue
                row = dataclasses.replace(row, rate_per_s=rate)
                progress.note(f"{row.variant}, paced at {rate:,.0f} msgs/s")
                results.append(_measured(started[system], row, work_dir, consumer_processes, log))
                progress.advance(row.messages)
    finally:
        for system, peer in started.items():
            peer.stop()
            log(f"[{system}] stopped")
    return results, versions


def _start(system: str, rows: list[Row], warmup_messages: int, work_dir: Path, log):
    peer = peers.PEERS[system](work_dir)
    try:
        log(f"[{system}] starting")
        began = time.monotonic()
        warmup = Row(VARIANTS[system][0], 1000, 100, False, warmup_messages, warmup=True)
        peer.start([warmup] + rows)
        log(f"[{system}] ready after {time.monotonic() - began:.1f} s")
        return peer, ""
    except (peers.PeerFailed, OSError) as error:
        peer.stop()
        log(f"[{system}] FAILED to start: {error}")
        return peer, f"{system} did not start: {error}"


def _versions(peer, system: str) -> dict:
    try:
        return peer.versions()
    except Exception as error:  # a version probe must not sink the run
        return {system: f"unknown ({error})"}


def _paced_rate(results: list[dict], variant: str) -> int:
    unpaced = next((r for r in results if r["variant"] == variant and not r.get("paced")
                    and (r["groups"], r["prefetch"], r["durable"]) == PACED_KEY and _ok(r)), None)
    return int(unpaced["throughput_per_s"] * PACED_FRACTION) if unpaced else 0


def _measured(peer, row: Row, work_dir: Path, consumer_processes: int, log) -> dict:
    if not peer.alive():
        return _failed(row, f"{row.system} process exited ({peer.log_tail()})")
    result = _run_row(peer, row, work_dir, consumer_processes, log)
    pace = f" paced at {row.rate_per_s:,}/s" if row.paced else ""
    log(f"[{row.variant}] groups={row.groups} prefetch={row.prefetch} durable={row.durable}{pace}: "
        f"{result['throughput_per_s']:.0f} msgs/s, p50 {result['latency_p50_ms']:.1f} ms, "
        f"p99 {result['latency_p99_ms']:.1f} ms, broker {result['broker_cpu_us_per_msg']:.0f} us/msg, "
        f"client {result['client_cpu_us_per_msg']:.0f} us/msg, violations {result['order_violations']}, "
        f"split {result['groups_split']}, per consumer {result['per_consumer']}, load {result['load_1m']:.1f} "
        f"{result['errors'] or ''}")
    return result


def _run_row(peer, row: Row, work_dir: Path, consumer_processes: int, log) -> dict:
    try:
        target = peer.prepare(row)
    except Exception as error:
        return _failed(row, f"setup failed: {type(error).__name__}: {error}")
    workload = clients.Workload(messages=row.messages, groups=row.groups, prefetch=row.prefetch,
                                durable=row.durable, consumers=row.consumers, rate_per_s=row.rate_per_s)
    load_1m = float(Path("/proc/loadavg").read_text().split()[0])
    started = time.monotonic()
    outcome = clients.measure(target, workload, peer.cpu_seconds, work_dir / "rows" / row.queue, consumer_processes)
    wall_s = time.monotonic() - started
    try:
        peer.cleanup(row)
    except Exception as error:
        log(f"[{row.variant}] cleanup of {row.queue} failed: {error}")
    result = {**dataclasses.asdict(row), "system": row.system, "wall_s": round(wall_s, 2), "load_1m": load_1m,
              **dataclasses.asdict(outcome)}
    return result


def _failed(row: Row, reason: str) -> dict:
    return {**dataclasses.asdict(row), "system": row.system, "failed": True,
            **dataclasses.asdict(clients.RowOutcome(errors=[reason]))}


# --- the report --------------------------------------------------------------------------------

def machine_facts() -> dict:
    facts = {"cores": str(len(__import__("os").sched_getaffinity(0))), "kernel": platform.release()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                facts["cpu"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                facts["memory"] = f"{int(line.split()[1]) / 1024 / 1024:.0f} GiB"
    except OSError:
        pass
    return facts


def client_versions() -> dict:
    versions = {"Python": platform.python_version()}
    for package in ("python-qpid-proton", "stomp.py", "pika"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def _number(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


def _ratio(value: float, reference: float | None) -> str:
    if not reference or not value:
        return "—"
    return f"{value / reference:.2f}"


def _send_seconds(result: dict) -> str:
    return _number(result["producer_send_s"], 1) if "producer_send_s" in result else "—"


def _ok(result: dict | None) -> bool:
    return bool(result) and not result.get("failed") and result["unique"] > 0 and not result["errors"]


def render(report: dict) -> str:
    results = report["results"]
    grouper = {_row_key(r): r for r in results if r["variant"] == "grouper"}
    order = {variant: index for index, variant in enumerate(LABELS)}
    rows = sorted(results, key=lambda r: (*_row_key(r), order[r["variant"]]))
    lines = [
        "# Benchmarks: Grouper against RabbitMQ and ActiveMQ",
        "",
        "Generated by `bench/run.py`; do not edit by hand (rerun it). How to run: `bench/README.md`.",
        "",
        f"- Date: {report['date']}",
        f"- Command: `{report['command'].strip()}`",
        f"- Machine: {report['machine'].get('cpu', '?')}, {report['machine']['cores']} cores, "
        f"{report['machine'].get('memory', '?')} RAM, Linux {report['machine']['kernel']}; shared and noisy, "
        "so differences under ~15% between runs are not meaningful.",
        "- Versions: " + ", ".join(f"{name} {version}" for name, version in report["versions"].items()),
        f"- Workload per row: {report['messages']:,} messages of {report['body_bytes']} bytes, 1 producer, "
        f"{CONSUMERS} consumers, each consumer accepts every message; groups chosen at random (seeded) per message.",
        "",
        "## Results",
        "",
        "Broker CPU per message (from /proc, the broker's whole process tree) is the primary comparison: it does "
        "not depend on the client. Ratios are this system's value divided by Grouper's in the same row (CPU: above "
        "1 costs more than Grouper; msgs/s: above 1 is faster than Grouper). `—` where either side has no number.",
        "",
        "| groups | prefetch | durable | system | broker CPU µs/msg | ×Grouper | msgs/s | ×Grouper | p50 ms | p99 ms "
        "| send s | client CPU µs/msg | order violations | groups split | busiest consumer | lost / dup | load | notes |",
        "|---:|---:|:---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        reference = grouper.get(_row_key(r))
        reference = reference if _ok(reference) else None
        durable = "yes" if r["durable"] else "no"
        head = f"| {r['groups']} | {r['prefetch']} | {durable} | {LABELS[r['variant']]} "
        if r.get("failed") or not r["unique"]:
            reason = "; ".join(r["errors"]).replace("|", "/")[:300]
            lines.append(head + f"| FAILED | — | — | — | — | — | — | — | — | — | — | — | — | {reason} |")
            continue
        notes = [f"paced: {r['rate_per_s']:,} msgs/s offered"] if r.get("paced") else []
        if r["errors"]:
            notes.append("; ".join(r["errors"]).replace("|", "/")[:200])
        violations = _number(r["order_violations"])
        if r["variant"] not in GROUP_AWARE:
            violations += " (no groups)"
        busiest = max(r["per_consumer"]) / r["received"] * 100 if r["received"] else 0
        lines.append(
            head
            + f"| {_number(r['broker_cpu_us_per_msg'], 1)} "
            f"| {_ratio(r['broker_cpu_us_per_msg'], reference and reference['broker_cpu_us_per_msg'])} "
            f"| {_number(r['throughput_per_s'])} | {_ratio(r['throughput_per_s'], reference and reference['throughput_per_s'])} "
            f"| {_number(r['latency_p50_ms'], 1)} | {_number(r['latency_p99_ms'], 1)} "
            f"| {_send_seconds(r)} "
            f"| {_number(r['client_cpu_us_per_msg'])} | {violations} | {r['groups_split']} / {r['groups_seen']} "
            f"| {busiest:.0f}% | {r['lost']} / {r['duplicates']} | {r.get('load_1m', 0):.1f} | {'; '.join(notes)} |")
    lines += ["", "## Observations (computed from the table)", ""]
    lines += observations(results) or ["- nothing unusual was detected."]
    lines += ["", "## Against the target (computed from the table)", ""]
    lines += target_check(results)
    lines += ["", copied_text("run-analysis"), ""]
    lines += ["", copied_text("run-method"), ""]
    return "\n".join(lines)


def _span(values: list[float], digits: int = 0) -> str:
    low, high = min(values), max(values)
    return _number(low, digits) if round(low, digits) == round(high, digits) else f"{_number(low, digits)}–{_number(high, digits)}"


def _row_key(result: dict) -> tuple:
    return (result["groups"], result["prefetch"], result["durable"], bool(result.get("paced")))


def observations(results: list[dict]) -> list[str]:
    notes = []
    measured = [r for r in results if not r.get("failed") and r["unique"]]
    for protocol, variants in (("AMQP 1.0 (lean.py)", set(LABELS) - {"activemq", "grouper-tls"}),
                               ("STOMP (stomp.py)", {"activemq"})):
        for prefetch in sorted({r["prefetch"] for r in measured}):
            costs = [r["client_cpu_us_per_msg"] for r in measured
                     if r["variant"] in variants and r["prefetch"] == prefetch and not r.get("paced")]
            if costs:
                notes.append(f"- Client cost, {protocol}, prefetch {prefetch}: {_span(costs)} µs of client CPU per "
                             "message (producer + 4 consumers, on the same 2 cores as the broker).")
        paced = [r["client_cpu_us_per_msg"] for r in measured if r["variant"] in variants and r.get("paced")]
        if paced:
            notes.append(f"- Client cost, {protocol}, paced rows: {_span(paced)} µs per message (a paced producer "
                         "wakes for a few messages at a time, so each wake-up is shared by fewer messages).")
    for variant in LABELS:
        sends = [r["producer_send_s"] for r in measured if r["variant"] == variant and "producer_send_s" in r]
        walls = [r["unique"] / r["throughput_per_s"] for r in measured
                 if r["variant"] == variant and "producer_send_s" in r and r["throughput_per_s"]]
        if sends and walls:
            notes.append(f"- {LABELS[variant]}: the producer finished sending after {_span(sends, 1)} s of rows "
                         f"lasting {_span(walls, 1)} s.")
    notes += security_cost(results)
    hashed = [r for r in measured if r["variant"] == "rabbitmq-hash-sac" and r["per_consumer"]]
    for groups in sorted({r["groups"] for r in hashed}):
        rows = [r for r in hashed if r["groups"] == groups]
        idle = [r["per_consumer"].count(0) for r in rows]
        busiest = [max(r["per_consumer"]) / r["received"] * 100 for r in rows]
        if max(idle) or max(busiest) > 35:
            notes.append(f"- {LABELS['rabbitmq-hash-sac']}, {groups} groups: the hash left {_span(idle)} of "
                         f"{CONSUMERS} queues (and their consumers) idle; the busiest consumer took "
                         f"{_span(busiest)}% of the messages.")
    for variant in LABELS:
        mine = [r for r in results if r["variant"] == variant]
        failed = [r for r in mine if r.get("failed") or not r["unique"]]
        if mine and len(failed) == len(mine):
            notes.append(f"- {LABELS[variant]}: every row failed: {failed[0]['errors'][0] if failed[0]['errors'] else '?'}")
            continue
        if failed:
            notes.append(f"- {LABELS[variant]}: {len(failed)} of {len(mine)} rows failed.")
        if variant in GROUP_AWARE:
            bad = [r for r in mine if r["order_violations"] or r["groups_split"]]
            for r in bad:
                notes.append(f"- {LABELS[variant]}, {r['groups']} groups, prefetch {r['prefetch']}, "
                             f"durable {'yes' if r['durable'] else 'no'}: {r['order_violations']:,} messages "
                             f"received after a later message of their group; {r['groups_split']} of "
                             f"{r['groups_seen']} groups were delivered to more than one consumer.")
            clean = [r for r in mine if not (r.get("failed") or not r["unique"]) and r not in bad]
            if clean and not bad:
                notes.append(f"- {LABELS[variant]}: per-group order held in every row (no violations, no "
                             "group on two consumers).")
        lost = [r for r in mine if r["unique"] and (r["lost"] or r["duplicates"])]
        for r in lost:
            notes.append(f"- {LABELS[variant]}, {r['groups']} groups, prefetch {r['prefetch']}: "
                         f"{r['lost']} lost, {r['duplicates']} duplicated.")
    return notes


def security_cost(results: list[dict]) -> list[str]:
    """What TLS and SASL PLAIN add per message: the secured node's rows against the plain node's."""
    notes = []
    plain = {_row_key(r): r for r in results if r["variant"] == "grouper" and _ok(r)}
    for secured in sorted((r for r in results if r["variant"] == "grouper-tls" and _ok(r)), key=_row_key):
        reference = plain.get(_row_key(secured))
        if reference is None:
            continue
        cost, base = secured["broker_cpu_us_per_msg"], reference["broker_cpu_us_per_msg"]
        # /proc counts CPU in clock ticks, so each row's µs/msg is a multiple of one tick over its messages
        tick_us = 1e6 / peers.CLOCK_TICKS_PER_S / min(secured["messages"], reference["messages"])
        notes.append(
            f"- Security, {secured['groups']:,} groups, prefetch {secured['prefetch']}, durable "
            f"{'yes' if secured['durable'] else 'no'}: over TLS with SASL PLAIN the broker spent {_number(cost, 1)} "
            f"µs/msg against {_number(base, 1)} in the clear: TLS costs {cost - base:+.1f} µs per message "
            f"(±{tick_us:.1f}, one CPU tick over the row's messages; {cost / base:.2f}x); throughput "
            f"{_number(secured['throughput_per_s'])} against {_number(reference['throughput_per_s'])} msgs/s, "
            f"client CPU {_number(secured['client_cpu_us_per_msg'])} against "
            f"{_number(reference['client_cpu_us_per_msg'])} µs/msg.")
    return notes


def target_check(results: list[dict]) -> list[str]:
    """The issue's targets for Grouper, each with its ratio to the peers measured in the same run."""
    measured = {(r["variant"], *_row_key(r)): r for r in results if _ok(r)}

    def row(variant, groups, prefetch, durable, paced=False):
        return measured.get((variant, groups, prefetch, durable, paced))

    def verdict(ok: bool) -> str:
        return "**met**" if ok else "**missed**"

    lines = []
    for durable in (False, True):
        mine, activemq = row("grouper", 1000, 100, durable), row("activemq", 1000, 100, durable)
        kind = "durable" if durable else "not durable"
        if mine is None:
            lines.append(f"- Broker CPU, 1,000 groups, prefetch 100, {kind}: no Grouper row.")
            continue
        cost = mine["broker_cpu_us_per_msg"]
        text = (f"- Broker CPU, 1,000 groups, prefetch 100, {kind}: {_number(cost, 1)} µs/msg, target ≤ "
                f"{TARGET_CPU_US[durable]}: {verdict(cost <= TARGET_CPU_US[durable])}")
        if activemq:
            ratio = cost / activemq["broker_cpu_us_per_msg"]
            text += (f"; {ratio:.2f}x ActiveMQ Classic's {_number(activemq['broker_cpu_us_per_msg'], 1)}, target ≤ "
                     f"{TARGET_CPU_VS_ACTIVEMQ}x: {verdict(ratio <= TARGET_CPU_VS_ACTIVEMQ)}")
        peers_cost = [f"{LABELS[v]} {_number(r['broker_cpu_us_per_msg'], 1)} ({cost / r['broker_cpu_us_per_msg']:.2f}x)"
                      for v in ("rabbitmq-queue", "rabbitmq-hash-sac") if (r := row(v, 1000, 100, durable))]
        lines.append(text + (f". Against RabbitMQ: {'; '.join(peers_cost)}." if peers_cost else "."))
        one = row("grouper", 1000, 1, durable)
        if one:
            ratio = one["broker_cpu_us_per_msg"] / cost
            lines.append(f"- Prefetch 1 against prefetch 100, {kind}: {_number(one['broker_cpu_us_per_msg'], 1)} ÷ "
                         f"{_number(cost, 1)} = {ratio:.2f}x, target ≤ {TARGET_PREFETCH_1_VS_100}x: "
                         f"{verdict(ratio <= TARGET_PREFETCH_1_VS_100)}.")
    fastest = row("grouper", 1000, 100, False)
    if fastest:
        rate = fastest["throughput_per_s"]
        others = [f"{LABELS[v]} {_number(r['throughput_per_s'])}" for v in ("rabbitmq-queue", "rabbitmq-hash-sac", "activemq")
                  if (r := row(v, 1000, 100, False))]
        lines.append(f"- Throughput, 1,000 groups, prefetch 100, not durable: {_number(rate)} msgs/s, target ≥ "
                     f"{TARGET_THROUGHPUT_PER_S:,}: {verdict(rate >= TARGET_THROUGHPUT_PER_S)}"
                     + (f" (same row: {'; '.join(others)})." if others else "."))
    paced = row("grouper", 1000, 100, False, True)
    if paced:
        others = [f"{LABELS[v]} {_number(r['latency_p99_ms'], 1)} ms at {r['rate_per_s']:,}/s"
                  for v in ("rabbitmq-queue", "rabbitmq-hash-sac", "activemq") if (r := row(v, 1000, 100, False, True))]
        lines.append(f"- Latency at half the maximum rate ({paced['rate_per_s']:,} msgs/s offered): p50 "
                     f"{_number(paced['latency_p50_ms'], 2)} ms, p99 {_number(paced['latency_p99_ms'], 2)} ms, target "
                     f"p99 ≤ {TARGET_PACED_P99_MS:g} ms: {verdict(paced['latency_p99_ms'] <= TARGET_PACED_P99_MS)}"
                     + (f" (peers at half their own maximum: {'; '.join(others)})." if others else "."))
    return lines or ["- no Grouper row was measured."]




def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated: grouper,rabbitmq,activemq")
    parser.add_argument("--messages", type=int, default=20_000, help="messages per row (default 20000)")
    parser.add_argument("--quick", action="store_true", help="2000 messages per row, for a smoke run")
    parser.add_argument("--groups", default="4,1000")
    parser.add_argument("--prefetch", default="1,100")
    parser.add_argument("--durable", default="no,yes", help="no, yes, or no,yes")
    parser.add_argument("--paced", default="yes", help="yes: add the paced latency rows (1000 groups, prefetch "
                        "100, not durable, at half the system's own maximum rate)")
    parser.add_argument("--security", default="yes", help="yes: with grouper, add the security rows (a second "
                        "node with a users file, over TLS with SASL PLAIN; 1000 groups, prefetch 100)")
    parser.add_argument("--probe-groups", type=int, default=5000,
                        help="extra non-durable rows with this many groups, an ordering probe (0: none)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="markdown report")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="raw results")
    parser.add_argument("--work-dir", type=Path, help="broker data and logs (default: a temp dir)")
    parser.add_argument("--consumer-processes", type=int, default=1,
                        help="processes the 4 consumers are spread over (1: one process, 4 connections)")
    parser.add_argument("--render-only", action="store_true",
                        help="run nothing: rewrite --out from the results already in --json")
    parser.add_argument("--keep-other-systems", action="store_true",
                        help="keep rows of systems not run now from the --json file of an earlier run")
    args = parser.parse_args(argv)

    if args.render_only:
        write_keeping_others(args.out, render(json.loads(args.json.read_text())))
        print(f"wrote {args.out} from {args.json}")
        return 0
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown system(s): {', '.join(unknown)}")
    if args.security not in ("yes", "no"):
        parser.error("--security takes yes or no")
    messages = 2000 if args.quick else args.messages
    groups_list = [int(x) for x in args.groups.split(",")]
    prefetch_list = [int(x) for x in args.prefetch.split(",")]
    durable_list = [{"no": False, "yes": True}[x.strip()] for x in args.durable.split(",")]
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="grouper-bench-"))
    work_dir.mkdir(parents=True, exist_ok=True)

    progress: Progress | None = None

    def log(text: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {text}"
        if progress is not None:
            progress.say(line)
        else:
            print(line, flush=True)

    # SIGTERM unwinds like Ctrl-C, so every broker started so far is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))
    log(f"work dir {work_dir}; {messages} messages per row")
    started = time.monotonic()
    results: list[dict] = []
    versions = client_versions()
    variants = [variant for system in systems for variant in VARIANTS[system]]
    rows = matrix(variants, messages, groups_list, prefetch_list, durable_list, args.probe_groups)
    if args.security == "yes" and "grouper" in systems:
        secured = security_rows(rows, messages)
        if secured:
            rows += secured
            systems = [*systems, "grouper-tls"]
    paced = paced_rows(variants, messages) if args.paced == "yes" else []
    warmup_messages = {system: 2000 if args.quick else count for system, count in WARMUP_MESSAGES.items()}
    total_messages = (sum(row.messages for row in rows + paced)
                      + sum(warmup_messages[system] for system in systems if system in warmup_messages))
    with Progress(total_messages, "bench", "msg") as progress:
        system_results, system_versions = run_interleaved(systems, rows, paced, warmup_messages, work_dir,
                                                          args.consumer_processes, log, progress)
    progress = None
    results += system_results
    versions.update(system_versions)
    command = "python -m bench.run " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    if args.keep_other_systems and args.json.exists():
        earlier = json.loads(args.json.read_text())
        kept = [r for r in earlier["results"] if r["system"] not in systems]
        results += kept
        for name, version in earlier["versions"].items():
            versions.setdefault(name, version)
        if kept:
            command += f" (rows of {', '.join(sorted({r['system'] for r in kept}))} kept from the run of {earlier['date']})"
    report = {
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "command": command,
        "machine": machine_facts(),
        "versions": versions,
        "messages": messages,
        "body_bytes": 100,
        "consumer_processes": args.consumer_processes,
        "duration_s": round(time.monotonic() - started, 1),
        "results": results,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1, default=str) + "\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_keeping_others(args.out, render(report))
    log(f"done in {report['duration_s']:.0f} s; wrote {args.out} and {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
