"""What the outbound store's record of a paged message costs in-process, and what a restart's recovery
of a backlog peaks at: tracemalloc on the pure cores alone, no node, no journal (bench/outbound_memory.py
measures whole nodes).

    python3 bench/outbound_records.py [--messages N] [--per-group K] [--root DIR]

- records: N `Outbound.add`s for one owner, K messages per group, each with a route key tuple, a group
  id string and a size int of its own (as decoded messages bring them): traced bytes per entry.
- recovery: `ClusterProtocol.recover_outbound` of N bodiless Messages (as `Journal.recover` gives
  outbound names) over two owners' journal names, interleaved seqs, K per group: traced MiB of the
  input, the peak during the call (over the start) and what is left once the input is let go.
--root runs the code of another tree (e.g. a `git archive` of an earlier commit) for a before/after.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tracemalloc

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--per-group", type=int, default=1)
    parser.add_argument("--root", default=REPO, help="the tree whose node/ to measure (default: this one)")
    args = parser.parse_args()
    if args.messages < 1 or args.per_group < 1:
        parser.error("--messages and --per-group must be at least 1")
    sys.path.insert(0, args.root)  # before an installed copy of the package, which may be another tree
    from node.core.broker import Broker
    from node.core.cluster_protocol import ClusterProtocol
    from node.core.message import Message
    from node.core.outbound import Outbound, outbound_name
    from node.core.settings import QueueSettings
    import node.core.outbound
    n, per_group = args.messages, args.per_group
    print(f"code: {node.core.outbound.__file__}; {n:,} messages, {per_group} per group")

    outbound = Outbound(memory_max_bytes=1)
    name = outbound.journal_name("n2", "orders")
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    for seq in range(1, n + 1):
        size_bytes = 1000 + seq % 1  # an int of its own per message, as len(payload) gives one
        outbound.add("n2", 1000 + seq, ("orders", "customer-%07d" % (seq // per_group)), name, size_bytes)
    gc.collect()
    print(f"records: {(tracemalloc.get_traced_memory()[0] - base) / n:.1f} B per entry")
    del outbound
    gc.collect()

    broker = Broker()
    broker.declare_queue(QueueSettings(name="q", durable=True))
    cluster = ClusterProtocol("n1", broker, handler_timeout_ms=300, routes_max=10, seq_reserve_block=100,
                              outbound_memory_max_bytes=1 << 20)
    base = tracemalloc.get_traced_memory()[0]
    names = [outbound_name(owner, "q") for owner in ("n2", "n3")]
    by_name: dict = {name: [] for name in names}
    for seq in range(1, n + 1):
        message = Message(b"", "customer-%07d" % (seq // per_group), seq=seq)
        message.payload, message.size_bytes = None, 1000 + seq % 1  # bodiless, as the journal recovers them
        by_name[names[seq % 2]].append(message)
    del message
    gc.collect()
    built = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.reset_peak()
    cluster.recover_outbound(by_name)
    peak = tracemalloc.get_traced_memory()[1] - base
    del by_name
    gc.collect()
    left = tracemalloc.get_traced_memory()[0] - base
    print(f"recovery: input {built / 2**20:.0f} MiB, peak {peak / 2**20:.0f} MiB, left {left / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
