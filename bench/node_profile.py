"""Where a Grouper node's CPU goes under the grouped workload: py-spy on one node, summarised.

    python -m bench.node_profile [--messages N] [--durable] [--prefetch N] [--duration-s S] [--native]

Starts one `grouper node` (peers.py), runs the grouped workload (1 producer, 4 consumers, 1,000
groups, prefetch 100 unless told) with lean.py's clients, and records the node with `py-spy record --format raw`
(`pip install py-spy`) for `--duration-s` once the flow is under way. It prints, as markdown, the
node's busy samples per function (inclusive: a function and what it calls) and per innermost frame
(self time). A profile, not a measurement: py-spy's sampling slows the node a little, so the row's
own numbers are not reported. This module reads samples; it starts nothing but the node and py-spy.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from bench import clients
from bench.grouper_peers import Grouper
from bench.matrix import Row
from bench.profile_categories import WAITING, fsync_frames

SAMPLE_RATE_HZ = 250
FRAME_PLACE = re.compile(r"^(?P<function>[^ ]+) \((?P<file>[^:)]+)")


def frame_name(frame: str) -> str:
    """'function (path/to/file.py)' with the line number dropped and the path cut to the project."""
    match = FRAME_PLACE.match(frame)
    if not match:
        return frame
    path = match["file"]
    for marker in ("/node/", "/site-packages/", "/lib/python3"):
        if marker in path:
            path = path[path.index(marker) + 1:]
            break
    return f"{match['function']} ({path})"


def summarize(path: Path, top: int = 25) -> tuple[int, list, list]:
    """(busy samples, [(frame, inclusive share %)], [(frame, self share %)]) of a py-spy raw file."""
    inclusive: dict[str, int] = {}
    leaves: dict[str, int] = {}
    busy = 0
    fsync = fsync_frames()
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        if fsync.search(stack.rsplit(";", 1)[-1]):
            continue
        frames = [frame_name(frame) for frame in stack.split(";")[1:]]  # [0] is the thread
        if not frames or WAITING.search(frames[-1]):
            continue
        count = int(count_text)
        busy += count
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + count
        leaves[frames[-1]] = leaves.get(frames[-1], 0) + count

    def shares(table):
        ranked = sorted(table.items(), key=lambda item: -item[1])[:top]
        return [(frame, round(count / busy * 100, 1)) for frame, count in ranked]

    return busy, shares(inclusive), shares(leaves)


def render(busy: int, inclusive: list, leaves: list, command: str) -> str:
    lines = [f"Busy samples: {busy:,} (`{command}`)", "", "| function (inclusive) | % of busy |", "|---|---:|"]
    lines += [f"| `{frame}` | {share} |" for frame, share in inclusive]
    lines += ["", "| innermost frame (self) | % of busy |", "|---|---:|"]
    lines += [f"| `{frame}` | {share} |" for frame, share in leaves]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=400_000, help="enough for the flow to outlast the profile")
    parser.add_argument("--durable", action="store_true")
    parser.add_argument("--prefetch", type=int, default=100)
    parser.add_argument("--duration-s", type=int, default=8)
    parser.add_argument("--native", action="store_true", help="py-spy --native: C frames (proton-c, uvloop) too")
    parser.add_argument("--out", type=Path, help="also write the raw samples here")
    args = parser.parse_args(argv)

    work_dir = Path(tempfile.mkdtemp(prefix="grouper-profile-"))
    row = Row("grouper", 1000, args.prefetch, args.durable, args.messages)
    node = Grouper(work_dir)
    node.start([row])
    raw = args.out or work_dir / "profile.txt"
    command = ["py-spy", "record", "-p", str(node.process.pid), "--format", "raw", "--rate", str(SAMPLE_RATE_HZ),
               "--duration", str(args.duration_s), "--output", str(raw)]
    # --nonblocking reads the node without pausing it, but py-spy reads C stacks only from a paused process
    command.append("--native" if args.native else "--nonblocking")
    spy: list[subprocess.Popen] = []
    try:
        workload = clients.Workload(messages=args.messages, groups=1000, prefetch=args.prefetch, durable=args.durable)
        # py-spy starts a second after the go, when the flow is in its steady state
        timer = threading.Timer(1.0, lambda: spy.append(subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                                                          stderr=subprocess.DEVNULL)))
        timer.start()
        outcome = clients.measure(node.prepare(row), workload, node.cpu_seconds, work_dir / "row", 1)
        timer.cancel()
        for process in spy:
            process.wait(args.duration_s + 30)
    finally:
        node.stop()
    print(f"flow under the profiler: {outcome.throughput_per_s:,.0f} msgs/s, {outcome.errors or 'no errors'}")
    if not raw.exists():
        print("py-spy wrote nothing (is it installed? does ptrace work here?)")
        return 1
    print(render(*summarize(raw), f"py-spy record --format raw --rate {SAMPLE_RATE_HZ}"
                                  f"{' --native' if args.native else ''} -p NODE"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
