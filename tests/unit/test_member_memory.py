"""The raft member gives back what a compacted raft log held (handler/member.py: return_freed_memory).

pysyncobj mmaps its journal file and, after a compaction, reuses it from the start, so the pages it
wrote before stay resident; unmapping them must lose nothing: the file and the mapping still hold
every byte, faulted back in when read.
"""

from __future__ import annotations

import mmap
import os

from handler.member import return_freed_memory

MAPPING_BYTES = 8 << 20


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
