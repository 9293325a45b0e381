"""The benchmark's lean client encodes and reads messages as proton does (bench/lean.py)."""

import sys
from pathlib import Path

import pytest
from proton import Message

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import lean  # noqa: E402


@pytest.mark.parametrize("durable", [False, True])
@pytest.mark.parametrize("group_as_subject", [False, True])
def test_an_encoded_bench_message_decodes_with_proton_to_the_same_fields(durable, group_as_subject):
    encoder = lean.MessageEncoder(body_bytes=100, durable=durable, group_as_subject=group_as_subject)

    message = Message()
    message.decode(encoder.encode("g0042", 123_456_789_012, 7))

    assert message.group_id == "g0042"
    assert message.subject == ("g0042" if group_as_subject else None)
    assert message.durable is durable
    assert message.properties == {"bench_sent_ns": 123_456_789_012, "bench_seq": 7}
    assert bytes(message.body) == b"x" * 100


def test_the_reader_gets_group_seq_and_send_time_back_from_the_encoder():
    encoder = lean.MessageEncoder(body_bytes=100, durable=True, group_as_subject=False)

    assert lean.read_fields(encoder.encode("g0001", 5_000_000_000, 3)) == ("g0001", 3, 5_000_000_000)


def test_the_reader_reads_what_proton_encodes_with_annotations_and_other_properties():
    message = Message(body="hello", group_id="orders-17", durable=True, subject="s", id="m-1", ttl=30,
                      properties={"other": "x", "bench_seq": 12, "bench_sent_ns": 2**40, "more": 1.5})
    message.annotations = {"x-opt-enqueued-time": 1_700_000_000_000}

    assert lean.read_fields(message.encode()) == ("orders-17", 12, 2**40)


def test_a_message_without_the_bench_fields_reads_as_missing():
    assert lean.read_fields(Message(body=b"raw").encode()) == (None, -1, 0)
