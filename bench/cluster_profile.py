"""The cluster benchmark's profile (not measured): py-spy on the forwarding node and on an owner during
a (b2) flow, and each node's samples summed per thread, per part of the code (profile_categories.py's
table) and per busy innermost frame."""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
from pathlib import Path

from bench.cluster_nodes import Cluster
from bench.profile_categories import WAITING, category, fsync_frames
from bench.workloads import REMOTE_LAYOUT, FlowRow, measure_flow


PROFILE_DURATION_S = 10
PROFILE_MESSAGES_MIN = 30_000  # enough for the producer to outlast the profile


def run_profile(cluster: Cluster, work_dir: Path, messages: int) -> dict:
    """py-spy on the forwarding node (1) and an owner (2) during a (b2) flow; the summary per node."""
    if not shutil.which("py-spy"):
        return {"failed": "py-spy is not installed"}
    nodes = cluster.nodes
    remote = REMOTE_LAYOUT
    out_dir = work_dir / "profile"
    out_dir.mkdir(parents=True, exist_ok=True)
    spies = []
    window_cpu: dict[str, list[float]] = {}

    def start_spies():
        window_cpu["start"] = cluster.cpu_seconds()
        threading.Timer(PROFILE_DURATION_S, lambda: window_cpu.setdefault("end", cluster.cpu_seconds())).start()
        for index, role in ((0, "forwarder"), (1, "owner")):
            path = out_dir / f"node{index + 1}-{role}.txt"
            spies.append((role, index, path, subprocess.Popen(
                ["py-spy", "record", "-p", str(nodes[index].pid), "-f", "raw", "--nonblocking", "--threads",
                 "-d", str(PROFILE_DURATION_S), "-o", str(path)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))

    row = FlowRow("profile", "b2 under py-spy", "profile", 0, remote, max(messages, PROFILE_MESSAGES_MIN))
    flow = measure_flow(nodes, row, work_dir / "rows" / "profile",
                        before_go=lambda: cluster.wait_consumers("profile", remote), on_go=start_spies)
    summaries = {}
    for role, index, path, spy in spies:
        try:
            _, stderr = spy.communicate(timeout=PROFILE_DURATION_S + 30)
        except subprocess.TimeoutExpired:
            spy.kill()
            stderr = b"py-spy did not finish"
        cpu_s = (window_cpu["end"][index] - window_cpu["start"][index]) if "end" in window_cpu else None
        summaries[role] = summarize_profile(path) | {"node": index + 1, "raw": str(path),
                                                      "cpu_s_in_window": None if cpu_s is None else round(cpu_s, 2),
                                                      "py_spy_errors": stderr.decode(errors="replace")[-300:]
                                                      if spy.returncode else ""}
    return {"flow_throughput_per_s": round(flow["throughput_per_s"]), "node_cpu_us_per_msg": flow["node_cpu_us_per_msg"],
            **summaries}


THREAD_NAMES = (
    (re.compile(r"_autoTickThread"), "raft tick (pysyncobj)"),
    (re.compile(r"_serve\)"), "gRPC server poller"),
    (re.compile(r"^forward-"), "forwarders (one per owner)"),
    (re.compile(r"ThreadPoolExecutor|^admin"), "gRPC handler pool (peer and admin calls)"),
)


def thread_name(frame: str) -> str:
    name = frame.split(": ", 1)[1].strip() if ": " in frame else frame
    return next((label for pattern, label in THREAD_NAMES if pattern.search(name)), name)


def summarize_profile(path: Path) -> dict:
    """Busy samples (not waiting) per thread and per part of the code, and the top busy leaf frames."""
    if not path.exists():
        return {"samples": 0}
    threads: dict[str, int] = {}
    categories: dict[str, int] = {}
    leaves: dict[str, int] = {}
    total = waiting = fsync_samples = 0
    fsync = fsync_frames()
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        if fsync.search(frames[-1]):
            fsync_samples += count
            continue
        if WAITING.search(frames[-1]):
            waiting += count
            continue
        thread = thread_name(frames[0])
        threads[thread] = threads.get(thread, 0) + count
        part = category(frames[1:])
        categories[part] = categories.get(part, 0) + count
        leaf = re.sub(r":\d+\)", ")", frames[-1])
        leaves[leaf] = leaves.get(leaf, 0) + count
    busy = total - waiting - fsync_samples

    def share(table):
        return {key: round(value / busy * 100, 1) for key, value in sorted(table.items(), key=lambda item: -item[1])}

    return {"samples": total, "busy_samples": busy, "waiting_pct": round(waiting / total * 100, 1) if total else 0,
            "fsync_pct": round(fsync_samples / total * 100, 1) if total else 0,
            "threads_pct": share(threads) if busy else {}, "categories_pct": share(categories) if busy else {},
            "top_leaves_pct": dict(list(share(leaves).items())[:12]) if busy else {}}
