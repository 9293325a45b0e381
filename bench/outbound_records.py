"""What the outbound store's record of a paged message costs in-process, and what a restart's recovery
of a backlog peaks at: tracemalloc on the pure cores alone, no node, no journal (bench/outbound_memory.py
measures whole nodes).

    python3 -m bench.outbound_records [--messages N] [--per-group K] [--root DIR] [--journal DIR]

- records: N `Outbound.add`s for one owner, K messages per group, each with a route key tuple, a group
  id string and a size int of its own (as decoded messages bring them): traced bytes per entry.
- recovery: `ClusterProtocol.recover_outbound` of N bodiless entries in the shape `Journal.recover`
  gives outbound names (a BodilessBacklog of parallel arrays per name; in a tree without it, bodiless
  Messages, as it gave them before) over two owners' journal names, interleaved seqs, K per group:
  traced MiB of the input, the peak during the call (over the start) and what is left once the input
  is let go.
- with --journal DIR: the same N entries (260-byte bodies) written as STOREs to a journal in DIR
  (emptied first), then `Journal.recover(bodiless_prefix=OUTBOUND_PREFIX)` and `recover_outbound` as
  runtime.Node.recover calls them: the peak of each over the start, and what is left.
--root runs the code of another tree (e.g. a `git archive` of an earlier commit) for a before/after.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tracemalloc
from array import array

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--per-group", type=int, default=1)
    parser.add_argument("--root", default=REPO, help="the tree whose node/ to measure (default: this one)")
    parser.add_argument("--journal", help="a directory for the journal measure (its journal files are replaced)")
    args = parser.parse_args()
    if args.messages < 1 or args.per_group < 1:
        parser.error("--messages and --per-group must be at least 1")
    sys.path.insert(0, args.root)  # before an installed copy of the package, which may be another tree
    from node.core.dispatch.broker import Broker
    from node.core.cluster import ClusterProtocol
    from node.core.dispatch.message import Message
    from node.core.cluster.outbound import Outbound, outbound_name
    from node.core.dispatch.settings import QueueSettings
    import node.core.cluster.outbound
    try:
        from node.store.journal import BodilessBacklog
    except ImportError:  # a tree from before it: the journal gave bodiless Messages
        BodilessBacklog = None
    n, per_group = args.messages, args.per_group
    print(f"code: {node.core.cluster.outbound.__file__}; {n:,} messages, {per_group} per group")

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
    if BodilessBacklog is None:
        for seq in range(1, n + 1):
            message = Message(b"", "customer-%07d" % (seq // per_group), seq=seq)
            message.payload, message.size_bytes = None, 1000 + seq % 1  # bodiless, as the journal recovers them
            by_name[names[seq % 2]].append(message)
        del message
        shape = "bodiless Messages"
    else:
        by_name = {name: BodilessBacklog(array("q"), [], array("q")) for name in names}
        for seq in range(1, n + 1):
            backlog = by_name[names[seq % 2]]
            backlog.seqs.append(seq)
            backlog.group_ids.append("customer-%07d" % (seq // per_group))  # a string each, as decoded
            backlog.size_bytes.append(1000 + seq % 1)
        del backlog
        shape = "BodilessBacklog arrays"
    gc.collect()
    built = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.reset_peak()
    cluster.recover_outbound(by_name)
    peak = tracemalloc.get_traced_memory()[1] - base
    del by_name
    gc.collect()
    left = tracemalloc.get_traced_memory()[0] - base
    print(f"recovery ({shape}): input {built / 2**20:.0f} MiB, peak {peak / 2**20:.0f} MiB, left {left / 2**20:.0f} MiB")
    del cluster, broker
    gc.collect()
    if args.journal:
        from_journal(args.journal, n, per_group)


def from_journal(directory: str, n: int, per_group: int) -> None:
    from node.core.dispatch.broker import Broker
    from node.core.cluster import ClusterProtocol
    from node.core.dispatch.message import Message
    from node.core.cluster.outbound import OUTBOUND_PREFIX, outbound_name
    from node.core.dispatch.settings import QueueSettings
    from node.store.journal import COMPACT_SUFFIX, JOURNAL_FILE, Journal

    for file_name in (JOURNAL_FILE, JOURNAL_FILE + COMPACT_SUFFIX):
        if os.path.exists(os.path.join(directory, file_name)):
            os.remove(os.path.join(directory, file_name))
    os.makedirs(directory, exist_ok=True)
    tracemalloc.stop()  # writing is not measured
    names = [outbound_name(owner, "q") for owner in ("n2", "n3")]
    journal = Journal(directory, fsync=False)
    journal.recover()
    body = b"x" * 260  # past the small ints Python shares: a size int of its own per message, as in a node
    for seq in range(1, n + 1):
        journal.store(names[seq % 2], Message(body, "customer-%07d" % (seq // per_group), seq=seq))
        if seq % 10_000 == 0:
            journal.flush()
    journal.close()
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    journal = Journal(directory, fsync=False)
    recovery = journal.recover(bodiless_prefix=OUTBOUND_PREFIX)
    scan_peak, scanned = tracemalloc.get_traced_memory()[1] - base, tracemalloc.get_traced_memory()[0] - base
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q", durable=True))
    cluster = ClusterProtocol("n1", broker, handler_timeout_ms=300, routes_max=10, seq_reserve_block=100,
                              outbound_memory_max_bytes=1 << 20)
    tracemalloc.reset_peak()
    cluster.recover_outbound({name: recovery.messages[name] for name in names})
    peak = tracemalloc.get_traced_memory()[1] - base
    del recovery
    gc.collect()
    left = tracemalloc.get_traced_memory()[0] - base
    journal.close()
    print(f"from the journal: Journal.recover peak {scan_peak / 2**20:.0f} MiB, leaving {scanned / 2**20:.0f} MiB; "
          f"recover_outbound peak {peak / 2**20:.0f} MiB, left {left / 2**20:.0f} MiB (the journal's index "
          f"included)")


if __name__ == "__main__":
    main()
