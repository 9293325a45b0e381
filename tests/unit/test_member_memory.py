"""The raft member bounds and gives back what its raft log holds (handler/member.py, handler/member_memory.py).

pysyncobj mmaps its journal file and, after a compaction, reuses it from the start, so the pages it
wrote before stay resident; unmapping them must lose nothing: the file and the mapping still hold
every byte, faulted back in when read.
"""

from __future__ import annotations

import ast
import mmap
import os
import socket
import subprocess
import sys
from pathlib import Path

from handler.member import Member
from handler.member_memory import LOG_ROUTES_BEFORE_COMPACTION, return_freed_memory
from node.core.cluster.feed import MEMBERS, ROUTES

MAPPING_BYTES = 8 << 20
ROOT = Path(__file__).resolve().parents[2]


def resident_bytes_of_mapping(path: str) -> int:
    """Rss of the mapping of `path` in /proc/self/smaps (kB lines after its header)."""
    resident, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5 and ":" not in fields[0]:
                inside = line.rstrip("\n").endswith(" " + path)
            elif inside and fields[0] == "Rss:":
                resident += int(fields[1]) * 1024
    return resident


def test_a_journal_mapping_leaves_the_resident_set_and_keeps_every_byte(tmp_path):
    path = os.path.realpath(tmp_path / "raft.journal")
    with open(path, "wb") as file:
        file.truncate(MAPPING_BYTES)
    with open(path, "r+b") as file:
        mapped = mmap.mmap(file.fileno(), 0)
    pattern = bytes(range(256)) * (MAPPING_BYTES // 256)
    mapped[:] = pattern  # every page written, as pysyncobj writes its log
    assert resident_bytes_of_mapping(path) >= MAPPING_BYTES // 2
    done = return_freed_memory(path)
    assert "malloc_trim" in done and f"{MAPPING_BYTES >> 20} MiB of raft.journal's mapping released" in done
    assert resident_bytes_of_mapping(path) == 0
    assert mapped[:] == pattern  # faulted back in from the page cache: nothing lost
    mapped.flush()
    mapped.close()
    with open(path, "rb") as file:
        assert file.read() == pattern


def test_a_path_nobody_maps_releases_nothing_and_never_raises(tmp_path):
    assert return_freed_memory(str(tmp_path / "nothing")).endswith("0 MiB of nothing's mapping released")


class CountingHandler:
    def __init__(self):
        self.compactions = 0

    def compact_log(self):
        self.compactions += 1


def test_the_member_asks_for_a_log_compaction_once_per_bound_of_route_changes_applied():
    node_end, member_end = socket.socketpair()
    member = Member(member_end)
    member.channel.send = lambda message: None  # what the member tells the node is not this test's
    routes = [("q", f"g{number}", "n1") for number in range(1000)]
    for _ in range(LOG_ROUTES_BEFORE_COMPACTION // 1000 - 1):
        member._applied(ROUTES, routes, 5)  # while pysyncobj replays its journal: no handler yet
    member.handler = CountingHandler()
    member._applied(MEMBERS, {"nodes": {}, "consumers": {}, "down": {}}, None)  # not a route change
    assert member.handler.compactions == 0
    member._applied(ROUTES, routes, 5)
    assert member.handler.compactions == 1
    for _ in range(LOG_ROUTES_BEFORE_COMPACTION // 1000 - 1):
        member._applied(ROUTES, routes, 5)
    assert member.handler.compactions == 1  # counted afresh after asking
    member._applied(ROUTES, [(key[0], key[1], None) for key in routes], None)  # removals count too
    assert member.handler.compactions == 2
    node_end.close()
    member_end.close()


def test_the_raft_member_process_loads_the_feeds_vocabulary_without_the_cluster_protocol():
    # node/core/cluster/__init__.py loads the protocol lazily: the member imports node.core.cluster.feed,
    # and the protocol with the broker and the queues behind it would add ~6 MB to its resident set
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, handler.member, handler.service, node.core.cluster.feed; "
                               "print(sorted(name for name in sys.modules if name.startswith('node.core')))"],
        capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    modules = set(ast.literal_eval(loaded.stdout))
    assert "node.core.cluster.feed" in modules
    assert not modules & {"node.core.cluster.protocol", "node.core.dispatch.broker", "node.core.dispatch.queue"}, modules
