"""A transaction's commit batch in the journal (issue 31): recovery keeps all of it or none of it.

The journal writes a commit's records between TXN_BEGIN(count) and TXN_COMMIT (node/store/records.py,
format version 2); recovery (node/store/recovery.py `committed`) applies them only once the commit record
is read. Each test tears the file at one point of the batch and recovers it.
"""

from __future__ import annotations

import pytest

from node.core.dispatch.message import Message
from node.store import records
from node.store.journal import JOURNAL_FILE, Journal


def queue_settings(name: str = "q") -> dict:
    return {"name": name, "durable": True}


def write_commit(directory) -> tuple[int, list[int]]:
    """A plain send, then a commit of three sends and the plain send's removal. Returns the file size before
    the commit, and the offsets where each of the commit's frames ends."""
    journal = Journal(directory, fsync=False)
    journal.recover()
    journal.declare(queue_settings())
    journal.store("q", Message(b"plain", "g", seq=1))
    journal.flush()
    journal.close()
    before = (directory / JOURNAL_FILE).stat().st_size
    journal = Journal(directory, fsync=False)
    journal.recover()
    mark = journal.transaction_begin()
    for seq in (2, 3, 4):
        journal.store("q", Message(f"in-txn-{seq}".encode(), "g", seq=seq))
    journal.remove("q", 1)
    journal.transaction_end(mark)
    frames = [frame for _, _, frame in journal._pending]
    journal.flush()
    journal.close()
    ends, offset = [], before
    for frame in frames:
        offset += len(frame)
        ends.append(offset)
    return before, ends


def recovered(directory) -> tuple[list[bytes], int]:
    journal = Journal(directory, fsync=False)
    recovery = journal.recover()
    journal.close()
    return [m.payload for m in recovery.messages.get("q", [])], recovery.cut_bytes


def tear(directory, size_bytes: int) -> None:
    with open(directory / JOURNAL_FILE, "r+b") as file:
        file.truncate(size_bytes)


def test_a_commit_is_written_between_its_begin_and_its_commit_record(tmp_path):
    before, ends = write_commit(tmp_path)
    data = (tmp_path / JOURNAL_FILE).read_bytes()
    kinds = []
    offset = before
    for end in ends:
        kinds.append(data[offset + records.FRAME_HEADER_BYTES])
        offset = end
    assert kinds == [records.TXN_BEGIN, records.STORE, records.STORE, records.STORE, records.REMOVE,
                     records.TXN_COMMIT]
    assert recovered(tmp_path) == ([b"in-txn-2", b"in-txn-3", b"in-txn-4"], 0)


@pytest.mark.parametrize("frames_kept", [0, 1, 2, 3, 4, 5])
def test_a_commit_torn_before_its_commit_record_recovers_to_nothing_of_it(tmp_path, frames_kept):
    before, ends = write_commit(tmp_path)
    tear(tmp_path, ends[frames_kept - 1] if frames_kept else before + 3)  # 0: torn inside TXN_BEGIN
    messages, cut_bytes = recovered(tmp_path)
    assert messages == [b"plain"]
    assert cut_bytes > 0
    assert (tmp_path / JOURNAL_FILE).stat().st_size == before  # cut at the batch's start


def test_a_commit_torn_inside_its_commit_record_recovers_to_nothing_of_it(tmp_path):
    before, ends = write_commit(tmp_path)
    tear(tmp_path, ends[-1] - 1)
    assert recovered(tmp_path)[0] == [b"plain"]


def test_a_commit_whose_commit_record_is_whole_recovers_whole_and_later_records_go_on(tmp_path):
    before, ends = write_commit(tmp_path)
    with open(tmp_path / JOURNAL_FILE, "ab") as file:
        file.write(records.encode_store("q", Message(b"after", "g", seq=5)) + b"\x07\x00")  # then a torn header
    messages, cut_bytes = recovered(tmp_path)
    assert messages == [b"in-txn-2", b"in-txn-3", b"in-txn-4", b"after"]
    assert cut_bytes == 2


def test_a_batch_that_does_not_add_up_is_cut_at_its_start(tmp_path):
    before, _ = write_commit(tmp_path)
    tear(tmp_path, before)
    with open(tmp_path / JOURNAL_FILE, "ab") as file:  # counts three records, holds one
        file.write(records.encode_transaction_begin(3) + records.encode_store("q", Message(b"x", "g", seq=9))
                   + records.encode_transaction_commit())
    assert recovered(tmp_path)[0] == [b"plain"]
    assert (tmp_path / JOURNAL_FILE).stat().st_size == before


def test_one_record_needs_no_batch(tmp_path):
    journal = Journal(tmp_path, fsync=False)
    journal.recover()
    mark = journal.transaction_begin()
    journal.store("q", Message(b"one", "g", seq=1))
    journal.transaction_end(mark)
    assert [kind for kind, _, _ in journal._pending] == [records.STORE]
    journal.close()


def test_a_version_1_file_is_still_read_a_version_2_file_too_and_new_files_stay_marked_1(tmp_path):
    with open(tmp_path / JOURNAL_FILE, "wb") as file:  # as the build before transactions wrote it
        file.write(records.encode_format(1) + records.encode_declare(queue_settings())
                   + records.encode_store("q", Message(b"old", "g", seq=1)))
    assert recovered(tmp_path)[0] == [b"old"]
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    Journal(fresh, fsync=False).recover()
    # marked 1 so a rollback by one release reads a file that holds no transaction (node/store/records.py)
    assert (fresh / JOURNAL_FILE).read_bytes() == records.encode_format(1)
    marked_2 = tmp_path / "marked_2"
    marked_2.mkdir()
    with open(marked_2 / JOURNAL_FILE, "wb") as file:
        file.write(records.encode_format(2) + records.encode_declare(queue_settings())
                   + records.encode_store("q", Message(b"two", "g", seq=1)))
    assert recovered(marked_2)[0] == [b"two"]
