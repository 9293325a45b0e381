"""What a selector reads of a message (node.amqp.message_fields), checked on messages proton encodes: the
application properties with their JMS types, the JMS header names by the AMQP JMS mapping, NULL for what is
absent, and absence (never an exception) for bytes that cannot be read."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from proton import Message, symbol, ulong

from node.amqp.message_fields import OPAQUE, MessageFields
from node.core.dispatch.selector import compile_selector


def fields_of(**message) -> MessageFields:
    return MessageFields(bytes(Message(**message).encode()))


def test_application_properties_keep_their_jms_types():
    fields = fields_of(body="x", properties={"colour": "green", "weight": 2600, "ratio": 0.5, "flag": True,
                                             "kind": symbol("car"), "big": ulong(2 ** 63)})
    assert [fields.get(name) for name in ("colour", "weight", "ratio", "flag")] == ["green", 2600, 0.5, True]
    assert fields.get("kind") == "car" and fields.get("big") == 2 ** 63
    assert type(fields.get("weight")) is int and type(fields.get("flag")) is bool


def test_values_jms_has_no_type_for_are_present_but_opaque():
    fields = fields_of(body="x", properties={"bytes": b"\x01", "list": [1, 2], "map": {"a": 1}, "id": uuid.UUID(int=1)})
    assert fields.get("bytes") == b"\x01" and fields.get("list") is OPAQUE and fields.get("map") is OPAQUE
    assert fields.get("id") == uuid.UUID(int=1)


def test_an_absent_property_is_none_and_not_in_the_mapping():
    fields = fields_of(body="x", properties={"a": 1})
    assert fields.get("b") is None and "b" not in fields and fields.get("b", 7) == 7
    with pytest.raises(KeyError):
        fields["b"]


def test_the_jms_headers_come_from_the_amqp_sections():
    fields = fields_of(body="x", group_id="g1", group_sequence=7, priority=9, durable=True, id="ID:m1",
                       correlation_id="c1", subject="subject", creation_time=1700000000.5,
                       expiry_time=1700000100.0, annotations={symbol("x-opt-jms-type"): "car"})
    assert fields.get("JMSXGroupID") == "g1" and fields.get("JMSXGroupSeq") == 7
    assert fields.get("JMSPriority") == 9 and fields.get("JMSDeliveryMode") == "PERSISTENT"
    assert fields.get("JMSMessageID") == "ID:m1" and fields.get("JMSCorrelationID") == "c1"
    assert fields.get("JMSType") == "car"  # the annotation Qpid JMS writes wins over the subject
    assert fields.get("JMSTimestamp") == 1700000000500 and fields.get("JMSExpiration") == 1700000100000


def test_the_jms_headers_defaults_when_the_sections_are_absent():
    fields = fields_of(body="x")
    assert fields.get("JMSPriority") == 4 and fields.get("JMSDeliveryMode") == "NON_PERSISTENT"
    assert fields.get("JMSTimestamp") == 0 and fields.get("JMSExpiration") == 0
    assert [fields.get(name) for name in ("JMSXGroupID", "JMSXGroupSeq", "JMSMessageID", "JMSCorrelationID",
                                          "JMSType")] == [None] * 5
    assert dict(fields) == {"JMSPriority": 4, "JMSDeliveryMode": "NON_PERSISTENT", "JMSTimestamp": 0,
                            "JMSExpiration": 0}


def test_jmstype_falls_back_to_the_subject_and_ids_of_other_types_read_as_qpid_jms_shows_them():
    assert fields_of(body="x", subject="car").get("JMSType") == "car"
    assert fields_of(body="x", id=ulong(5)).get("JMSMessageID") == "ID:AMQP_ULONG:5"
    assert fields_of(body="x", id=uuid.UUID(int=1)).get("JMSMessageID") == f"ID:AMQP_UUID:{uuid.UUID(int=1)}"
    assert fields_of(body="x", correlation_id=b"\xab\x01").get("JMSCorrelationID") == "ID:AMQP_BINARY:AB01"


def test_a_group_id_sent_as_an_application_property_is_jmsxgroupid_as_the_codec_reads_it():
    fields = fields_of(body="x", properties={"JMSXGroupID": "g2", "JMSXGroupSeq": 3})
    assert fields.get("JMSXGroupID") == "g2" and fields.get("JMSXGroupSeq") == 3
    assert fields_of(body="x", group_id="g1", properties={"JMSXGroupID": "g2"}).get("JMSXGroupID") == "g1"


def test_the_other_jms_names_fall_back_to_an_application_property_of_the_same_name_too():
    sent = {"JMSMessageID": "ID:p", "JMSCorrelationID": "c", "JMSType": "t", "JMSPriority": 1}
    fields = fields_of(body="x", properties=sent)
    assert [fields.get(name) for name in sent] == ["ID:p", "c", "t", 4]  # JMSPriority is the header's, always


def test_a_selector_reads_a_real_message():
    selector = compile_selector("JMSType = 'car' AND colour = 'blue' AND weight > 2500 AND JMSXGroupID = 'g1' "
                                "AND JMSPriority > 4 AND JMSDeliveryMode = 'PERSISTENT'")
    message = dict(body="x", group_id="g1", priority=7, durable=True, annotations={symbol("x-opt-jms-type"): "car"})
    assert selector.matches(fields_of(properties={"colour": "blue", "weight": 2600}, **message))
    assert not selector.matches(fields_of(properties={"colour": "blue", "weight": 2400}, **message))


def test_only_the_sections_asked_for_are_decoded():
    payload = bytes(Message(body="x", properties={"a": 1}, priority=9).encode())
    fields = MessageFields(payload)
    assert fields.get("a") == 1
    assert fields._header is None and fields._properties is None  # noqa: SLF001 - what laziness promises


def test_symbolic_section_descriptors_are_read():
    # header [durable=true, priority=7] and application-properties {"a": 1} with symbolic descriptors
    header = b"\x00\xa3\x10amqp:header:list" + b"\xc0\x04\x02\x41\x50\x07"
    properties = b"\x00\xa3\x1famqp:application-properties:map" + b"\xc1\x06\x02\xa1\x01a\x54\x01"
    fields = MessageFields(header + properties + b"\x00\x53\x77\xa1\x01x")
    assert fields.get("JMSPriority") == 7 and fields.get("JMSDeliveryMode") == "PERSISTENT" and fields.get("a") == 1


@pytest.mark.parametrize("payload", [b"", b"garbage", b"\x00\x53\x74", b"\x00\x53\x74\xc1\x09\x02\xa1\x01a",
                                     b"\x00\x53\x74\xc1\x04\x02\xa1\x01\xff\x40", b"\x00\x53\x74\x40",
                                     b"\x00\x53\x74\xc1\x03\x02\xa1\x05a\x40"])
def test_unreadable_bytes_read_as_absent_fields(payload):
    fields = MessageFields(payload)
    assert fields.get("a") is None and fields.get("JMSXGroupID") is None and fields.get("JMSPriority") == 4
    assert compile_selector("a IS NULL").matches(fields)


def test_deeply_described_values_are_passed_over_without_recursion():
    deep = b"\x00" * 5000 + b"\x53\x01" * 5000 + b"\x40"  # 5000 nested descriptors: a recursive reader overflows
    after = bytes(Message(body="x", properties={"a": 1}).encode())
    assert MessageFields(b"\x00\x53\x72" + deep + after).get("a") == 1
    assert MessageFields(b"\x00\x53\x74" + deep).get("a") is None


def test_a_broken_section_leaves_the_sections_before_it_readable():
    payload = bytes(Message(body="x", priority=8, properties={"a": 1}).encode())
    cut = payload.index(b"\x00\x53\x74") + 6  # inside the application properties
    fields = MessageFields(payload[:cut])
    assert fields.get("JMSPriority") == 8 and fields.get("a") is None


@settings(max_examples=300, deadline=None)
@given(payload=st.binary(max_size=64), names=st.lists(st.sampled_from(["a", "JMSType", "JMSXGroupID",
                                                                      "JMSPriority", "JMSMessageID"]), max_size=3))
def test_no_bytes_make_the_reader_raise(payload, names):
    fields = MessageFields(payload)
    for name in names:
        fields.get(name)
    dict(fields)


@settings(max_examples=100, deadline=None)
@given(properties=st.dictionaries(st.text(min_size=1, max_size=5),
                                  st.one_of(st.text(max_size=5), st.integers(-2 ** 63, 2 ** 63 - 1), st.booleans(),
                                            st.floats(allow_nan=False)), max_size=5))
def test_application_properties_read_back_as_proton_wrote_them(properties):
    assert dict(fields_of(body="x", properties=properties).items()) == {
        **{name: value for name, value in fields_of(body="x").items()},
        **properties}  # names of at most 5 characters never shadow a JMS name


def test_only_the_application_properties_a_selector_names_are_decoded():
    properties = {f"p{number}": f"value {number}" for number in range(20)}
    fields = fields_of(body="x", properties={**properties, "colour": "green"})
    assert compile_selector("colour = 'green'").matches(fields)
    assert fields._application == {"colour": "green"}  # noqa: SLF001 - what laziness promises
    assert fields.get("p3") == "value 3" and fields.get("missing") is None


def test_a_value_that_cannot_be_read_is_absent_alone():
    # application-properties {"a": <str8 of a byte that is not UTF-8>, "b": 1}
    fields = MessageFields(b"\x00\x53\x74" + b"\xc1\x0c\x04" + b"\xa1\x01a\xa1\x01\xff" + b"\xa1\x01b\x54\x01")
    assert fields.get("a") is None and fields.get("b") == 1
