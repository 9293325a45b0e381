"""Run the grouped workload against Grouper and its peers and write docs/benchmarks.md.

    python bench/run.py [--systems grouper,rabbitmq,activemq] [--messages N] [--quick]

One broker runs at a time (the machine has 2 cores); each gets a warm-up row that is not reported,
then every row of the matrix: groups x prefetch x durable, same messages, 1 producer, 4 consumers.
A system that cannot start, or a row that stalls, is reported as failed with the reason: numbers
are only ever measured ones. This module owns the matrix and the report; peers.py owns brokers and
clients.py owns message traffic.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import platform
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import clients  # noqa: E402
import peers  # noqa: E402
from report_file import write_keeping_others  # noqa: E402

REPO_ROOT = peers.REPO_ROOT
DEFAULT_OUT = REPO_ROOT / "docs" / "benchmarks.md"
DEFAULT_JSON = REPO_ROOT / "bench" / "results" / "last-run.json"
SYSTEMS = ("grouper", "rabbitmq", "activemq")
VARIANTS = {
    "grouper": ("grouper",),
    "rabbitmq": ("rabbitmq-queue", "rabbitmq-hash-sac"),
    "activemq": ("activemq",),
}
LABELS = {
    "grouper": "Grouper, exclusive groups (AMQP 1.0)",
    "rabbitmq-queue": "RabbitMQ plain queue, no groups (AMQP 1.0)",
    "rabbitmq-hash-sac": "RabbitMQ hash exchange + 4 SAC queues (AMQP 1.0)",
    "activemq": "ActiveMQ Classic, JMSXGroupID (STOMP)",
}
GROUP_AWARE = {"grouper", "rabbitmq-hash-sac", "activemq"}
WARMUP_MESSAGES = 2000
CONSUMERS = 4


@dataclass(frozen=True)
class Row:
    variant: str
    groups: int
    prefetch: int
    durable: bool
    messages: int
    consumers: int = CONSUMERS
    warmup: bool = False

    @property
    def system(self) -> str:
        return next(system for system, variants in VARIANTS.items() if self.variant in variants)

    @property
    def queue(self) -> str:
        kind = "warmup" if self.warmup else f"g{self.groups}-p{self.prefetch}-{'d' if self.durable else 'n'}"
        return f"bench-{self.variant}-{kind}"

    def key(self) -> tuple:
        return (self.groups, self.prefetch, self.durable)


def matrix(variants, messages: int, groups_list, prefetch_list, durable_list, probe_groups: int) -> list[Row]:
    rows = [Row(variant, groups, prefetch, durable, messages)
            for variant in variants for groups in groups_list for prefetch in prefetch_list
            for durable in durable_list]
    if probe_groups:  # ordering probe: more groups than ActiveMQ's default group map holds (1024)
        rows += [Row(variant, probe_groups, max(prefetch_list), False, messages) for variant in variants]
    return rows


def run_system(system: str, rows: list[Row], work_dir: Path, consumer_processes: int, log) -> tuple[list[dict], dict]:
    peer = peers.PEERS[system](work_dir)
    warmups = [Row(variant, 4, 100, False, min(WARMUP_MESSAGES, rows[0].messages), warmup=True)
               for variant in VARIANTS[system][:1]]
    results = []
    try:
        versions = peer.versions()
    except Exception as error:  # a version probe must not sink the run
        versions = {system: f"unknown ({error})"}
    try:
        log(f"[{system}] starting")
        started = time.monotonic()
        peer.start(warmups + rows)
        log(f"[{system}] ready after {time.monotonic() - started:.1f} s")
    except (peers.PeerFailed, OSError) as error:
        peer.stop()
        log(f"[{system}] FAILED to start: {error}")
        return [_failed(row, f"{system} did not start: {error}") for row in rows], versions
    try:
        for row in warmups:
            result = _run_row(peer, row, work_dir, consumer_processes, log)
            log(f"[{system}] warm-up: {result['throughput_per_s']:.0f} msgs/s {result['errors'] or ''}")
        for row in rows:
            if not peer.alive():
                results.append(_failed(row, f"{system} process exited ({peer.log_tail()})"))
                continue
            result = _run_row(peer, row, work_dir, consumer_processes, log)
            results.append(result)
            log(f"[{row.variant}] groups={row.groups} prefetch={row.prefetch} durable={row.durable}: "
                f"{result['throughput_per_s']:.0f} msgs/s, p50 {result['latency_p50_ms']:.1f} ms, "
                f"p99 {result['latency_p99_ms']:.1f} ms, broker {result['broker_cpu_us_per_msg']:.0f} us/msg, "
                f"client {result['client_cpu_us_per_msg']:.0f} us/msg, violations {result['order_violations']}, "
                f"split {result['groups_split']}, per consumer {result['per_consumer']} {result['errors'] or ''}")
    finally:
        peer.stop()
        log(f"[{system}] stopped")
    return results, versions


def _run_row(peer, row: Row, work_dir: Path, consumer_processes: int, log) -> dict:
    try:
        target = peer.prepare(row)
    except Exception as error:
        return _failed(row, f"setup failed: {type(error).__name__}: {error}")
    workload = clients.Workload(messages=row.messages, groups=row.groups, prefetch=row.prefetch,
                                durable=row.durable, consumers=row.consumers)
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
    grouper = {(r["groups"], r["prefetch"], r["durable"]): r for r in results if r["variant"] == "grouper"}
    order = {variant: index for index, variant in enumerate(LABELS)}
    rows = sorted(results, key=lambda r: (r["groups"], r["prefetch"], r["durable"], order[r["variant"]]))
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
        "Ratios are this system's value divided by Grouper's in the same row (msgs/s: above 1 is faster "
        "than Grouper; CPU: above 1 costs more than Grouper). `—` where either side has no number.",
        "",
        "| groups | prefetch | durable | system | msgs/s | ×Grouper | p50 ms | p99 ms | send s | broker CPU µs/msg "
        "| ×Grouper | client CPU µs/msg | order violations | groups split | busiest consumer | lost / dup | load | notes |",
        "|---:|---:|:---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        reference = grouper.get((r["groups"], r["prefetch"], r["durable"]))
        reference = reference if _ok(reference) else None
        durable = "yes" if r["durable"] else "no"
        head = f"| {r['groups']} | {r['prefetch']} | {durable} | {LABELS[r['variant']]} "
        if r.get("failed") or not r["unique"]:
            reason = "; ".join(r["errors"]).replace("|", "/")[:300]
            lines.append(head + f"| FAILED | — | — | — | — | — | — | — | — | — | — | — | — | {reason} |")
            continue
        notes = []
        if r["errors"]:
            notes.append("; ".join(r["errors"]).replace("|", "/")[:200])
        violations = _number(r["order_violations"])
        if r["variant"] not in GROUP_AWARE:
            violations += " (no groups)"
        busiest = max(r["per_consumer"]) / r["received"] * 100 if r["received"] else 0
        lines.append(
            head
            + f"| {_number(r['throughput_per_s'])} | {_ratio(r['throughput_per_s'], reference and reference['throughput_per_s'])} "
            f"| {_number(r['latency_p50_ms'], 1)} | {_number(r['latency_p99_ms'], 1)} "
            f"| {_send_seconds(r)} "
            f"| {_number(r['broker_cpu_us_per_msg'])} "
            f"| {_ratio(r['broker_cpu_us_per_msg'], reference and reference['broker_cpu_us_per_msg'])} "
            f"| {_number(r['client_cpu_us_per_msg'])} | {violations} | {r['groups_split']} / {r['groups_seen']} "
            f"| {busiest:.0f}% | {r['lost']} / {r['duplicates']} | {r.get('load_1m', 0):.1f} | {'; '.join(notes)} |")
    lines += ["", "## Observations (computed from the table)", ""]
    lines += observations(results) or ["- nothing unusual was detected."]
    lines += ["", "## Against the target (computed from the table)", ""]
    lines += target_check(results)
    lines += ["", TARGET_ANALYSIS.strip(), ""]
    lines += ["", METHOD.strip(), ""]
    return "\n".join(lines)


def _span(values: list[float], digits: int = 0) -> str:
    low, high = min(values), max(values)
    return _number(low, digits) if round(low, digits) == round(high, digits) else f"{_number(low, digits)}–{_number(high, digits)}"


def observations(results: list[dict]) -> list[str]:
    notes = []
    measured = [r for r in results if not r.get("failed") and r["unique"]]
    for protocol, variants in (("AMQP 1.0 (proton)", set(LABELS) - {"activemq"}), ("STOMP (stomp.py)", {"activemq"})):
        for prefetch in sorted({r["prefetch"] for r in measured}):
            costs = [r["client_cpu_us_per_msg"] for r in measured if r["variant"] in variants and r["prefetch"] == prefetch]
            if costs:
                notes.append(f"- Client cost, {protocol}, prefetch {prefetch}: {_span(costs)} µs of client CPU per "
                             "message (producer + 4 consumers, on the same 2 cores as the broker).")
    for variant in LABELS:
        sends = [r["producer_send_s"] for r in measured if r["variant"] == variant and "producer_send_s" in r]
        walls = [r["unique"] / r["throughput_per_s"] for r in measured
                 if r["variant"] == variant and "producer_send_s" in r and r["throughput_per_s"]]
        if sends and walls:
            notes.append(f"- {LABELS[variant]}: the producer finished sending after {_span(sends, 1)} s of rows "
                         f"lasting {_span(walls, 1)} s.")
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


def target_check(results: list[dict]) -> list[str]:
    """The issue's target per row: Grouper's msgs/s at or above every peer's, and its broker CPU per
    message within 2x of the best peer's."""
    measured = [r for r in results if not r.get("failed") and r["unique"]]
    rows = sorted({(r["groups"], r["prefetch"], r["durable"]) for r in measured})
    met, notes = 0, []
    for key in rows:
        mine = [r for r in measured if (r["groups"], r["prefetch"], r["durable"]) == key]
        grouper = next((r for r in mine if r["variant"] == "grouper"), None)
        peers = [r for r in mine if r["variant"] != "grouper"]
        if grouper is None or not peers:
            continue
        fastest = max(peers, key=lambda r: r["throughput_per_s"])
        cheapest = min(peers, key=lambda r: r["broker_cpu_us_per_msg"])
        speed_ok = grouper["throughput_per_s"] >= fastest["throughput_per_s"]
        cpu_ok = grouper["broker_cpu_us_per_msg"] <= 2 * cheapest["broker_cpu_us_per_msg"]
        met += speed_ok and cpu_ok
        if not (speed_ok and cpu_ok):
            notes.append(f"- {key[0]} groups, prefetch {key[1]}, durable {'yes' if key[2] else 'no'}: "
                         f"throughput {grouper['throughput_per_s'] / fastest['throughput_per_s']:.2f}x of the "
                         f"fastest peer ({LABELS[fastest['variant']]}){'' if speed_ok else ' (missed)'}; "
                         f"broker CPU {grouper['broker_cpu_us_per_msg'] / cheapest['broker_cpu_us_per_msg']:.2f}x "
                         f"of the cheapest ({LABELS[cheapest['variant']]}){'' if cpu_ok else ' (missed)'}.")
    return [f"- {met} of {len(rows)} rows meet the target (throughput >= every peer, broker CPU <= 2x the best peer)."] + notes


TARGET_ANALYSIS = """
## Why Grouper misses the target, and what it would take

Measured on this machine with py-spy on the node under the 1,000-group, prefetch-100 workload:

- **The event loop is the cost.** About two thirds of the node's CPU is python-qpid-proton's
  pure-Python event machinery: one `Event` object and fresh wrapper objects per event, each event
  dispatched through four handler layers (the container's handler, ours, the global overrides and the
  IO handler). A grouped message costs three events at the node: the incoming transfer, the
  consumer's disposition, and the consumer's credit top-up. Grouper's own code (arrival scan, group
  dispatch, journal) is the remaining third.
- **What was already taken out** (each measured before and after): reading the group id with a
  scanner of the header and properties sections instead of a full decode (28 -> 9 us per message);
  sending through proton's C binding without a Delivery wrapper per message; accepting non-durable
  sends at the end of each reactor batch so many settlements share one disposition frame (broker CPU
  508 -> 339 us per message); group commit of the journal once per reactor batch.
- **What it would take.** (1) Take the per-event Python cost away: drive proton-c's proactor from a
  small C (or cffi) extension that hands the Python core one batch per wake-up (the transfers,
  dispositions and credit changes of every link) instead of one Python event per frame; the dispatch
  core already takes and returns batches of effects, so only the adapter changes. (2) Use more than
  one core: a Python reactor is bound to one core by the GIL, so a node would run several reactor
  processes that each own a shard of the queues, with connections routed to the owning process (the
  route table of the cluster work can carry this). (3) At prefetch 1 the client's per-message credit
  top-up dominates every AMQP system alike; nothing broker-side removes that event.
"""


METHOD = """
## Method

- **One broker at a time.** `run.py` starts a system, runs an unreported warm-up row (2,000 messages,
  4 groups, prefetch 100, not durable), then the matrix rows, then stops it before the next system.
  Every broker is a subprocess of the run with a private directory under a temporary work dir and
  listens only on 127.0.0.1 (`bench/peers.py`).
- **Clients.** The producer runs in one process and the 4 consumers in another (multiprocessing,
  fork; `--consumer-processes N` spreads the consumers over N processes), each consumer with its own
  connection, so producer and consumers do not share one Python event loop. On this 2-core machine
  one consumer process measured 1.2-2.2x the throughput of four for every broker (and 13-44% less
  client CPU per message with proton, about the same with stomp.py; 10,000 messages, 1,000 groups):
  more runnable Python processes only compete with the broker for the same 2 cores. AMQP 1.0 clients use python-qpid-proton; the ActiveMQ clients use stomp.py
  because Debian's ActiveMQ has no AMQP module. The `client CPU` column shows what the clients took
  from the 2 cores the broker also runs on.
- **Producer.** AMQP: sends whenever it has link credit (the broker decides the window), unsettled,
  and counts the broker's outcomes; durable rows set the message header `durable`. STOMP: `SEND`
  without receipts (a receipt per message would make every send synchronous), header
  `persistent:true|false`, then `DISCONNECT` with a receipt. Each message carries the group id
  (AMQP `properties.group-id`; STOMP `JMSXGroupID`), its sequence number within the group and the
  producer's CLOCK_MONOTONIC send time as application properties / headers.
- **Consumers and prefetch.** AMQP: the receiver grants `prefetch` credit at attach and one more
  after each accept, so at most `prefetch` deliveries are unsettled per consumer (proton's automatic
  flow controller is off). STOMP: `ack:client-individual` with `activemq.prefetchSize:<prefetch>`,
  `ACK` per message. Every message is accepted as soon as it is received.
- **Systems.**
  - *Grouper*: one queue per row declared in a generated TOML config (`group_policy = "exclusive"`,
    `durable` per row), node started with `--amqp-port 0 --admin-port 0` and read for `ready`.
  - *RabbitMQ plain queue*: one classic queue, 4 competing consumers; the no-groups reference (its
    order violations show what grouping is there to prevent).
  - *RabbitMQ hash + SAC*: RabbitMQ's own recipe for ordered groups: an `x-consistent-hash` exchange
    (producer address `/exchange/NAME`, AMQP `subject` = group id = routing key) bound with weight 1
    to 4 classic queues declared with `x-single-active-consumer: true`; consumer *i* attaches to
    queue *i* (`/amq/queue/NAME-i`). Declarations go over AMQP 0-9-1 with pika on the same port.
    Durable rows: durable exchange and queues plus persistent (durable) messages. With few groups
    the hash can leave queues (and so consumers) idle: see `busiest consumer`.
  - *ActiveMQ Classic*: a queue per row, created on first use, default policies (message group map:
    1024 groups); durable rows send `persistent:true` (KahaDB).
- **Throughput** = distinct messages received ÷ (last consumer accept − first producer send).
- **Latency** = consumer receive time − producer send time, over every message (p50, p99). The
  producer runs flat out, so latency includes the time spent queued behind the backlog; it is a
  saturation latency, not an idle round trip.
- **Send s** = first to last send by the producer. Where it is much shorter than the row, the
  broker let the producer run far ahead (generous producer credit or async sends) and the latency
  columns mostly measure that backlog; where it is close to the row's length the broker held the
  producer back (flow control) and latency stays low at the same throughput.
- **Broker CPU µs/msg** = utime+stime (plus reaped children) summed over the broker's process tree
  from /proc, read just before the producer starts and just after the last message is received,
  divided by messages. **Client CPU** is the same for the client processes (from `os.times()`).
- **Order check.** Every consumer records (group, sequence, receive time). Per group, all consumers'
  receipts are merged by receive time; a message received after a later message of its group counts
  as one *order violation*. *Groups split* = groups delivered to more than one consumer. *Lost / dup*
  = sent minus distinct received / received more than once.
- **Ordering probe.** Besides the issue's matrix (4 and 1,000 groups × prefetch 1 and 100 × durable
  or not), each system gets a non-durable row with 5,000 groups at the largest prefetch
  (`--probe-groups`): more groups than
  ActiveMQ's default group map keeps (1,024), where PLATFORM.md saw ActiveMQ reorder.
- **Load** is the machine's 1-minute load average just before the row: other work on the shared
  machine plus the tail of this run's previous row (a busy row alone accounts for about 2). A row
  measured under a high load is slower than the system is.
- **Comparing across protocols.** ActiveMQ is driven over STOMP by stomp.py, whose client costs far
  less CPU per message than the proton client (see the client-cost lines under Observations). On 2
  shared cores that cheaper client frees CPU for the broker, so ActiveMQ's msgs/s and its ×Grouper
  ratio measure the client as well as the broker. Compare msgs/s among the AMQP rows (Grouper and
  RabbitMQ share one client); compare broker CPU µs/msg across all systems.
- **Failures** are reported in the row (`FAILED` and the reason, or a note), never replaced by numbers.
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated: grouper,rabbitmq,activemq")
    parser.add_argument("--messages", type=int, default=20_000, help="messages per row (default 20000)")
    parser.add_argument("--quick", action="store_true", help="2000 messages per row, for a smoke run")
    parser.add_argument("--groups", default="4,1000")
    parser.add_argument("--prefetch", default="1,100")
    parser.add_argument("--durable", default="no,yes", help="no, yes, or no,yes")
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
    messages = 2000 if args.quick else args.messages
    groups_list = [int(x) for x in args.groups.split(",")]
    prefetch_list = [int(x) for x in args.prefetch.split(",")]
    durable_list = [{"no": False, "yes": True}[x.strip()] for x in args.durable.split(",")]
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="grouper-bench-"))
    work_dir.mkdir(parents=True, exist_ok=True)

    def log(text: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)

    # SIGTERM unwinds like Ctrl-C, so every broker started so far is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))
    log(f"work dir {work_dir}; {messages} messages per row")
    started = time.monotonic()
    results: list[dict] = []
    versions = client_versions()
    for system in systems:
        rows = matrix(VARIANTS[system], messages, groups_list, prefetch_list, durable_list, args.probe_groups)
        system_results, system_versions = run_system(system, rows, work_dir, args.consumer_processes, log)
        results += system_results
        versions.update(system_versions)
    command = "python bench/run.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
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
