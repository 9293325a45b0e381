"""What a route costs in memory: the replicated route table in-process, and a real raft member process.

Every node holds the whole route table in its raft member process, so routes_max live routes cost
each node that much. Two measurements:
- in-process: N routes built in handler/route_table.py's RouteTable (claims of CLAIM_KEYS_MAX keys,
  as nodes propose them), measured with tracemalloc (Python's allocations) and the resident set,
  beside the same routes in version 1's layout ({(queue, group): [node, touched_ms]}, what the
  table held before routes were packed and what snapshot format 1 still carries), built directly;
- node: the node process's own copy, node/core/routing.py's Router, given the same routes as the
  applied feed gives them, with the default group timeout's lease (a refresh time per route);
- member: a single-member raft cluster (`python -m handler.member`, started as a node starts it,
  through handler/member_process.py) given N routes through claims; its resident set (VmRSS) and
  peak (VmHWM) from /proc once every route is applied. That adds pysyncobj: its log until compaction,
  and the snapshot it pickles at compaction.
Routes look like a node's: GROUP_PREFIX plus a number as the group id, QUEUES queues, NODES nodes.
Run: `python3 bench/route_memory.py --routes 1000000 [--skip-member]`; prints one JSON object.
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.peers import free_port, resident_bytes  # noqa: E402
from handler.leader_duties import GROUP_TIMEOUT_MS_DEFAULT  # noqa: E402
from handler.member_process import MemberProcess  # noqa: E402
from handler.route_table import ROUTES, RouteTable  # noqa: E402
from node.core.cluster_protocol import CLAIM_KEYS_MAX  # noqa: E402
from node.core.routing import Router  # noqa: E402

GROUP_PREFIX = "customer-"  # group ids as users write them: a word and a number
QUEUES = 4
NODES = 3
MEMBER_WINDOW_KEYS = 20 * CLAIM_KEYS_MAX  # claims in flight to the member before waiting for applies
MEMBER_WAIT_S = 600  # for every route to be applied in the member
# pysyncobj compacts its log into a snapshot past logCompactionMinEntries (its default, 5000) entries:
# after the routes, this many one-key refreshes make it take one, as a node's refreshes would
COMPACTION_ENTRIES = 5200
COMPACTION_WAIT_S = 300  # for the snapshot to be written (a forked child gzips it at low priority)


def keys(count: int) -> list[tuple[str, str]]:
    return [(f"orders-{index % QUEUES}", f"{GROUP_PREFIX}{index}") for index in range(count)]


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


def build_table(routes: list, now_ms: int) -> RouteTable:
    table = RouteTable(routes_max=len(routes))
    for node_index in range(NODES):
        table.report_consumers(f"node{node_index}:5674", {f"orders-{q}": 1 for q in range(QUEUES)}, now_ms)
    for start in range(0, len(routes), CLAIM_KEYS_MAX):
        chunk = [list(key) for key in routes[start:start + CLAIM_KEYS_MAX]]
        table.claim(chunk, f"node{start // CLAIM_KEYS_MAX % NODES}:5674", now_ms + start)
    assert len(table) == len(routes)
    return table


def build_version_1(routes: list, now_ms: int) -> dict:
    nodes = [f"node{index}:5674" for index in range(NODES)]
    return {key: [nodes[index % NODES], now_ms + index] for index, key in enumerate(routes)}


def build_router(routes: list, now_ms: int) -> Router:
    router = Router("node0:5674", handler_timeout_ms=5000, lease_ms=GROUP_TIMEOUT_MS_DEFAULT // 2)
    nodes = [f"node{index}:5674" for index in range(NODES)]
    for start in range(0, len(routes), CLAIM_KEYS_MAX):  # as the ROUTES feed brings them, a claim at a time
        router.learn([(queue, group, nodes[start // CLAIM_KEYS_MAX % NODES])
                      for queue, group in routes[start:start + CLAIM_KEYS_MAX]], now_ms + start)
    return router


def in_process(count: int) -> dict:
    now_ms = int(time.time() * 1000)
    result = {}
    for name, build in (("packed", build_table), ("version_1_layout", build_version_1),
                        ("node_router", build_router)):
        routes = keys(count)  # made outside the measure: the group strings count below, as they do in a table
        measured = measure(build, routes, now_ms)
        held = measured.pop("held")
        if name == "packed":
            started = time.perf_counter()
            assert held.expire_idle(now_ms - 1) == []  # a reaper round that removes nothing: a full scan
            measured["expire_scan_ms"] = round((time.perf_counter() - started) * 1000, 1)
        # the group ids were allocated before tracing, so add them: a table holds one string per route
        strings_bytes = sum(sys.getsizeof(group) for _, group in routes)
        measured["group_strings_bytes"] = strings_bytes
        measured["bytes_per_route"] = round((measured["traced_bytes"] + strings_bytes) / count, 1)
        result[name] = measured
        del held, routes
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
            routes = keys(count)
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
            target = count + COMPACTION_ENTRIES
            for number in range(COMPACTION_ENTRIES):
                with changed:
                    if not changed.wait_for(lambda: count + number - applied[0] <= MEMBER_WINDOW_KEYS, MEMBER_WAIT_S):
                        raise TimeoutError(f"{applied[0] - count} of {number} refreshes applied in {MEMBER_WAIT_S} s")
                process.claim([list(routes[number])], int(time.time() * 1000), on_failed=lambda keys, reason: None)
            with changed:
                changed.wait_for(lambda: applied[0] >= target, MEMBER_WAIT_S)
            dump = Path(raft_dir) / "raft.dump"
            waited_from = time.monotonic()
            while not dump.exists() and time.monotonic() - waited_from < COMPACTION_WAIT_S:
                time.sleep(0.5)
            snapshot_wait_s = round(time.monotonic() - waited_from, 1)
            time.sleep(2)  # for the member to drop the compacted log
            compacted = resident_bytes(process.pid)
            snapshot_bytes = dump.stat().st_size if dump.exists() else 0
        finally:
            process.stop()
    return {"idle_rss_bytes": idle["VmRSS"], "rss_bytes": full["VmRSS"], "peak_rss_bytes": full["VmHWM"],
            "rss_per_route_bytes": round((full["VmRSS"] - idle["VmRSS"]) / count, 1),
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
