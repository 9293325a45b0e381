"""Runs the main table's rows, interleaved. Every broker is started first and warmed up (a JVM ~100k
messages); then each row of the matrix runs on every system in turn, the systems' order rotating
from row to row, so that the machine's load (it is shared) falls on all of them alike. Only one
broker carries traffic at a time. Last come the paced rows: the producer held to half of the
system's own maximum rate, for latency. A system that cannot start, or a row that stalls, is
reported as failed with the reason: numbers are only ever measured ones. peers.py owns the brokers,
clients.py and lean.py the message traffic; this module owns the order and the outcome of each row."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

from bench import clients, peers
from bench.grouper_peers import Grouper, SecuredGrouper
from bench.matrix import PACED_FRACTION, PACED_KEY, VARIANTS, Row
from bench.other_brokers import ActiveMQ, RabbitMQ
from node.tools.progress import Progress
PEERS = {"grouper": Grouper, "rabbitmq": RabbitMQ, "activemq": ActiveMQ, "grouper-tls": SecuredGrouper}


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
    peer = PEERS[system](work_dir)
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
                    and (r["groups"], r["prefetch"], r["durable"]) == PACED_KEY and usable(r)), None)
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


def usable(result: dict | None) -> bool:
    """A row that ran and received something without errors: the only kind whose numbers are compared."""
    return bool(result) and not result.get("failed") and result["unique"] > 0 and not result["errors"]
