"""What a route costs in memory: the replicated route table in-process, and a real raft member process.

Every node holds the whole route table in its raft member process, so routes_max live routes cost
each node that much. Two measurements:
- in-process: N routes built in handler/route_table.py's RouteTable (claims of CLAIM_KEYS_MAX keys,
  as nodes propose them; each queue's routes a GroupMap, node/core/group_map.py), measured with
  tracemalloc (Python's allocations) and the resident set, beside the same routes in version 1's
  layout ({(queue, group): [node, touched_ms]}, what snapshot format 1 carries) and version 2's
  ({queue: {group: packed int}}, the table's dicts before GroupMap), built directly. The keys are
  made inside each measurement, so a layout is charged for the group id strings it keeps;
- node: the node process's own copy, node/core/cluster/routing.py's Router, given the same routes as the
  applied feed gives them, with the default group timeout's lease (a refresh time per route);
- member: a single-member raft cluster (`python -m handler.member`, started as a node starts it,
  through handler/member_process.py) given N routes through claims; its resident set (VmRSS) and
  peak (VmHWM) from /proc once every route is applied, with its anonymous and file-backed parts
  (RssAnon, RssFile: pysyncobj mmaps its raft journal), and again once its log was compacted into a
  snapshot and the member returned what the log held (handler/member.py). That adds pysyncobj: its
  log until compaction, and the snapshot it pickles at compaction.
Routes look like a node's: GROUP_PREFIX plus a number as the group id, QUEUES queues, NODES nodes.
Run: `python3 -m bench.route_memory --routes 1000000 [--skip-member]`; prints one JSON object.
Never a test: a million routes take a minute or more.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path

from bench.peers import free_port, resident_bytes
from handler.leader_duties import GROUP_TIMEOUT_MS_DEFAULT
from handler.member_memory import SNAPSHOT_CHECK_S
from handler.member_process import MemberProcess
from handler.route_table import RouteTable
from node.core.cluster import CLAIM_KEYS_MAX
from node.core.cluster.feed import ROUTES
from node.core.cluster.routing import Router

GROUP_PREFIX = "customer-"  # group ids as users write them: a word and a number
QUEUES = 4
NODES = 3
MEMBER_WINDOW_KEYS = 20 * CLAIM_KEYS_MAX  # claims in flight to the member before waiting for applies
MEMBER_WAIT_S = 600  # for every route to be applied in the member
# pysyncobj compacts its log into a snapshot past logCompactionMinEntries (its default, 5000) entries:
# after the routes, this many one-key refreshes make it take one, as a node's refreshes would
COMPACTION_ENTRIES = 5200
COMPACTION_WAIT_S = 300  # for the snapshot to be written (a forked child gzips it at low priority)


def memory_split(pid: int) -> dict:
    """The resident set's parts (/proc/PID/status): anonymous (the heap) and file-backed (pysyncobj maps
    its raft journal file), which tell a log held in memory from one held in the page cache."""
    return resident_bytes(pid, ("RssAnon", "RssFile"))


QUEUE_NAMES = [f"orders-{number}" for number in range(QUEUES)]  # one str each, as a table holds them


def keys(count: int, start: int = 0) -> list[tuple[str, str]]:
    return [(QUEUE_NAMES[index % QUEUES], f"{GROUP_PREFIX}{index}") for index in range(start, count)]


def key_chunks(count: int):
    """(first index, keys) a claim at a time, made as they are used: what a structure keeps of them (the
    group id strings in a dict, their bytes in a GroupMap) stays traced, what it does not keep is freed."""
    for start in range(0, count, CLAIM_KEYS_MAX):
        yield start, keys(min(count, start + CLAIM_KEYS_MAX), start)


def measure(build, *args) -> dict:
    """Bytes the structure `build(*args)` returns holds: tracemalloc's count and the resident set's growth."""
    gc.collect()
    rss_before = resident_bytes()["VmRSS"]
    tracemalloc.start()
    held = build(*args)
    gc.collect()
    traced_bytes, traced_peak_bytes = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    gc.collect()
    return {"traced_bytes": traced_bytes, "traced_peak_bytes": traced_peak_bytes,
            "rss_growth_bytes": resident_bytes()["VmRSS"] - rss_before, "held": held}


def build_table(count: int, now_ms: int) -> RouteTable:
    table = RouteTable(routes_max=count)
    for node_index in range(NODES):
        table.report_consumers(f"node{node_index}:5674", {f"orders-{q}": 1 for q in range(QUEUES)}, now_ms)
    for start, chunk in key_chunks(count):
        table.claim([list(key) for key in chunk], f"node{start // CLAIM_KEYS_MAX % NODES}:5674", now_ms + start)
    assert len(table) == count
    return table


def build_version_1(count: int, now_ms: int) -> dict:
    nodes = [f"node{index}:5674" for index in range(NODES)]
    return {key: [nodes[(start + offset) % NODES], now_ms + start + offset]
            for start, chunk in key_chunks(count) for offset, key in enumerate(chunk)}


def build_version_2(count: int, now_ms: int) -> dict:
    return {queue: {group: (now_ms + start + offset) << 16 | (start + offset) % NODES
                    for start, chunk in key_chunks(count) for offset, (key_queue, group) in enumerate(chunk)
                    if key_queue == queue} for queue in QUEUE_NAMES}


def build_router(count: int, now_ms: int) -> Router:
    router = Router("node0:5674", handler_timeout_ms=5000, lease_ms=GROUP_TIMEOUT_MS_DEFAULT // 2)
    nodes = [f"node{index}:5674" for index in range(NODES)]
    for start, chunk in key_chunks(count):  # as the ROUTES feed brings them, a claim at a time
        router.learn([(queue, group, nodes[start // CLAIM_KEYS_MAX % NODES]) for queue, group in chunk],
                     now_ms + start)
    return router


def in_process(count: int) -> dict:
    now_ms = int(time.time() * 1000)
    result = {}
    for name, build in (("packed", build_table), ("version_1_layout", build_version_1),
                        ("version_2_layout", build_version_2), ("node_router", build_router)):
        # the keys are made inside the measure, so whatever of them a layout keeps (the group id strings
        # of a dict; a GroupMap keeps their bytes only) is traced with it
        measured = measure(build, count, now_ms)
        held = measured.pop("held")
        if name == "packed":
            started = time.perf_counter()
            assert held.expire_idle(now_ms - 1) == []  # a reaper round that removes nothing: a full scan
            measured["expire_scan_ms"] = round((time.perf_counter() - started) * 1000, 1)
            routes = keys(count)
            started = time.perf_counter()
            for queue, group in routes:
                held.route(queue, group)
            measured["lookup_us"] = round((time.perf_counter() - started) * 1e6 / count, 2)
            del routes
        measured["bytes_per_route"] = round(measured["traced_bytes"] / count, 1)
        result[name] = measured
        del held
        gc.collect()
    return result


def member(count: int) -> dict:
    applied = [0]
    changed = threading.Condition()
    ready = threading.Event()

    def on_applied(kind, payload, at_ms):
        if kind == ROUTES:
            with changed:
                applied[0] += len(payload)
                changed.notify_all()

    with tempfile.TemporaryDirectory(prefix="route-memory-") as raft_dir:
        process = MemberProcess(f"127.0.0.1:{free_port()}", [], raft_dir, on_applied=on_applied,
                                on_ready=ready.set, on_lost=lambda: None, election_timeout_min_ms=200,
                                election_timeout_max_ms=500, routes_max=count)
        try:
            idle = resident_bytes(process.pid)
            started = time.monotonic()
            routes = keys(count)  # kept: the refreshes below name them again
            for start in range(0, count, CLAIM_KEYS_MAX):
                with changed:  # a bounded window, as nodes keep theirs: the member's queue never grows unbounded
                    if not changed.wait_for(lambda: start - applied[0] <= MEMBER_WINDOW_KEYS, MEMBER_WAIT_S):
                        raise TimeoutError(f"{applied[0]} of {start} routes applied in {MEMBER_WAIT_S} s")
                chunk = [list(key) for key in routes[start:start + CLAIM_KEYS_MAX]]
                process.claim(chunk, int(time.time() * 1000), on_failed=lambda keys, reason: print(
                    f"claim failed: {reason}", file=sys.stderr))
            with changed:
                if not changed.wait_for(lambda: applied[0] >= count, MEMBER_WAIT_S):
                    raise TimeoutError(f"{applied[0]} of {count} routes applied in {MEMBER_WAIT_S} s")
            elapsed_s = time.monotonic() - started
            full = resident_bytes(process.pid)
            full_split = memory_split(process.pid)
            target = count + COMPACTION_ENTRIES
            for number in range(COMPACTION_ENTRIES):
                with changed:
                    if not changed.wait_for(lambda: count + number - applied[0] <= MEMBER_WINDOW_KEYS, MEMBER_WAIT_S):
                        raise TimeoutError(f"{applied[0] - count} of {number} refreshes applied in {MEMBER_WAIT_S} s")
                # a refresh of a route there is (fewer routes than refreshes: some routes twice)
                process.claim([list(routes[number % count])], int(time.time() * 1000),
                              on_failed=lambda keys, reason: None)
            with changed:
                changed.wait_for(lambda: applied[0] >= target, MEMBER_WAIT_S)
            dump = Path(raft_dir) / "raft.dump"
            waited_from = time.monotonic()
            while not dump.exists() and time.monotonic() - waited_from < COMPACTION_WAIT_S:
                time.sleep(0.5)
            snapshot_wait_s = round(time.monotonic() - waited_from, 1)
            time.sleep(2 * SNAPSHOT_CHECK_S + 2)  # for the member to drop the compacted log and return its memory
            compacted = resident_bytes(process.pid)
            compacted_split = memory_split(process.pid)
            snapshot_bytes = dump.stat().st_size if dump.exists() else 0
        finally:
            process.stop()
    return {"idle_rss_bytes": idle["VmRSS"], "rss_bytes": full["VmRSS"], "peak_rss_bytes": full["VmHWM"],
            "rss_per_route_bytes": round((full["VmRSS"] - idle["VmRSS"]) / count, 1),
            "rss_anon_bytes": full_split["RssAnon"], "rss_file_bytes": full_split["RssFile"],
            "after_compaction_rss_anon_bytes": compacted_split["RssAnon"],
            "after_compaction_rss_file_bytes": compacted_split["RssFile"],
            "after_compaction_rss_bytes": compacted["VmRSS"], "after_compaction_peak_rss_bytes": compacted["VmHWM"],
            "snapshot_file_bytes": snapshot_bytes, "snapshot_written_after_s": snapshot_wait_s,
            "claims_per_s": round(count / elapsed_s)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--routes", type=int, default=1_000_000, help="routes to build (default 1,000,000)")
    parser.add_argument("--skip-member", action="store_true", help="the in-process figures only")
    args = parser.parse_args(argv)
    if args.routes <= 0:
        parser.error(f"--routes must be > 0, got {args.routes}")
    report = {"routes": args.routes, "in_process": in_process(args.routes)}
    if not args.skip_member:
        report["member"] = member(args.routes)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
