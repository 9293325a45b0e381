"""The delivery trace writer (node/store/trace.py): rotation, the total-bytes bound, torn tails, a refusing disk."""

from __future__ import annotations

import errno
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from node.store import trace
from node.store.trace import TraceFiles, TraceWriter, file_name
from tests.drills.checker import load_jsonl


def encoded(numbers, width: int = 0) -> list[bytes]:
    return [(json.dumps({"kind": "send", "sequence": n, "pad": "x" * width}) + "\n").encode() for n in numbers]


def sequences_on_disk(directory) -> list[int]:
    return [line["sequence"] for line in load_jsonl(sorted(directory.glob("*.jsonl")))]


def test_a_file_is_closed_before_a_batch_would_take_it_past_its_size(tmp_path):
    files = TraceFiles(tmp_path, file_max_bytes=1000, max_bytes=1 << 20)
    for start in range(0, 200, 10):
        files.write(encoded(range(start, start + 10)))
    sizes = [path.stat().st_size for path in sorted(tmp_path.glob("*.jsonl"))]
    assert len(sizes) > 3 and max(sizes) <= 1000
    assert sequences_on_disk(tmp_path) == list(range(200))  # names sort in writing order


def test_a_line_longer_than_a_file_gets_a_file_of_its_own(tmp_path):
    files = TraceFiles(tmp_path, file_max_bytes=1024, max_bytes=1 << 20)
    files.write(encoded([1]) + encoded([2], width=3000) + encoded([3]))
    assert [len(load_jsonl(path)) for path in sorted(tmp_path.glob("*.jsonl"))] == [1, 1, 1]


def test_past_the_total_bound_the_oldest_files_go_and_the_newest_lines_stay(tmp_path):
    files = TraceFiles(tmp_path, file_max_bytes=1024, max_bytes=4096)
    for start in range(0, 500, 5):
        files.write(encoded(range(start, start + 5)))
    kept = sequences_on_disk(tmp_path)
    assert files.total_bytes == sum(path.stat().st_size for path in tmp_path.glob("*.jsonl")) <= 4096
    assert kept == list(range(kept[0], 500)) and kept[0] > 0 and files.files_deleted > 0


@settings(max_examples=60, deadline=None)
@given(batches=st.lists(st.lists(st.integers(0, 300), min_size=0, max_size=20), max_size=30),
       file_max_bytes=st.integers(1024, 4000), files_kept=st.integers(2, 5))
def test_any_batches_keep_a_contiguous_newest_run_within_the_bounds(tmp_path_factory, batches, file_max_bytes,
                                                                    files_kept):
    directory = tmp_path_factory.mktemp("traces")
    max_bytes = files_kept * file_max_bytes
    files = TraceFiles(directory, file_max_bytes=file_max_bytes, max_bytes=max_bytes)
    written = []  # the reference: every line in order
    for widths in batches:
        lines = [(json.dumps({"sequence": len(written) + index, "pad": "x" * width}) + "\n").encode()
                 for index, width in enumerate(widths)]
        written += lines
        files.write(lines)
    on_disk = b"".join(path.read_bytes() for path in sorted(directory.glob("*.jsonl")))
    assert b"".join(written).endswith(on_disk)  # a suffix: only whole oldest files were deleted
    assert files.total_bytes == len(on_disk) <= max_bytes
    assert all(path.stat().st_size <= file_max_bytes for path in directory.glob("*.jsonl"))


def test_a_start_after_a_torn_tail_begins_a_new_file_and_both_read(tmp_path):
    (tmp_path / file_name(7)).write_bytes(b'{"kind":"send","sequence":1}\n{"kind":"send","seq')  # killed mid-line
    files = TraceFiles(tmp_path, file_max_bytes=1 << 20, max_bytes=1 << 30)
    files.write(encoded([2, 3]))
    files.close()
    assert sorted(path.name for path in tmp_path.glob("*.jsonl")) == [file_name(7), file_name(8)]
    assert sequences_on_disk(tmp_path) == [1, 2, 3]  # the torn line is the only one lost


def test_a_refusing_disk_drops_and_counts_lines_leaves_no_torn_line_and_recovers(tmp_path, monkeypatch):
    writer = TraceWriter(tmp_path, file_max_bytes=1 << 20, max_bytes=1 << 30)
    real_write = trace.os.write
    refusing = {"on": False}

    def write(fd, data):
        if refusing["on"]:
            real_write(fd, data[:len(data) // 2])  # part of the batch reaches the file first
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(trace.os, "write", write)
    writer.submit([{"kind": "send", "sequence": 1}, {"kind": "send", "sequence": 2}])
    writer.close()  # written and stopped: the next writer continues in the same directory
    refusing["on"] = True
    writer = TraceWriter(tmp_path, file_max_bytes=1 << 20, max_bytes=1 << 30)
    writer.submit([{"kind": "send", "sequence": 3}, {"kind": "send", "sequence": 4}])
    writer.close()
    assert (writer.lines_written, writer.lines_dropped) == (0, 2)
    refusing["on"] = False
    writer = TraceWriter(tmp_path, file_max_bytes=1 << 20, max_bytes=1 << 30)
    writer.submit([{"kind": "send", "sequence": 5}])
    writer.close()
    assert writer.stats()["lines_written"] == 1
    assert all(path.read_bytes().endswith(b"\n") or not path.read_bytes() for path in tmp_path.glob("*.jsonl"))
    assert sequences_on_disk(tmp_path) == [1, 2, 5]  # the failed part was cut back: no torn line anywhere


def test_a_writer_behind_by_its_buffer_drops_whole_batches_and_counts_them(tmp_path):
    writer = TraceWriter(tmp_path, file_max_bytes=1 << 20, max_bytes=1 << 30,
                         buffer_max_bytes=3 * trace.LINE_ESTIMATE_BYTES)
    writer._thread = "not started"  # as if started, so submit queues without starting the thread
    writer.submit([{"sequence": 1}, {"sequence": 2}])
    writer.submit([{"sequence": 3}, {"sequence": 4}])  # past the bound: dropped
    assert writer.lines_dropped == 2 and len(writer._batches) == 1
    writer._thread = None
    writer.start()
    writer.close()
    assert sequences_on_disk(tmp_path) == [1, 2] and writer.lines_written == 2


def test_a_node_that_traces_nothing_has_no_writer_thread_and_no_directory(tmp_path):
    writer = TraceWriter(tmp_path / "traces", file_max_bytes=1 << 20, max_bytes=1 << 30)
    writer.close()
    assert writer._thread is None and not (tmp_path / "traces").exists()
