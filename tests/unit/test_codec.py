"""The arrival scanner reads what proton's full decoder reads, for any message proton can encode."""

import pytest
from hypothesis import given, settings, strategies as st
from proton import Message

from node.amqp import codec
from node.amqp.type_encoding import Unreadable
from node.core.errors import InvalidField

texts = st.text(max_size=300)
property_values = st.one_of(texts, st.integers(-2**31, 2**31 - 1), st.booleans(), st.floats(allow_nan=False))
application_properties = st.dictionaries(
    st.sampled_from(["JMSXGroupID", "JMSXGroupSeq", "other", "custom"]), property_values, max_size=4)


def _outcome(read):
    try:
        arrival = read()
    except InvalidField:
        return "invalid-field"
    return arrival.address, arrival.group_id, arrival.closes_group, arrival.expires_at_ms


def _read_with_proton_only(payload, group_header, now_ms, monkeypatch):
    with monkeypatch.context() as patch:
        patch.setattr(codec, "_scan", lambda *_: (_ for _ in ()).throw(Unreadable()))
        return _outcome(lambda: codec.read_arrival(payload, group_header, now_ms))


@settings(max_examples=400, deadline=None)
@given(group_id=st.one_of(st.none(), texts), sequence=st.one_of(st.none(), st.integers(0, 2**32 - 1)),
       ttl_ms=st.one_of(st.none(), st.integers(1, 10**6)), address=st.one_of(st.none(), texts),
       properties=application_properties, body=st.one_of(st.binary(max_size=400), texts),
       message_id=st.one_of(st.none(), st.integers(0, 2**63), texts, st.uuids()),
       group_header=st.sampled_from(["", "custom"]))
def test_scanner_agrees_with_the_proton_decoder(group_id, sequence, ttl_ms, address, properties, body,
                                                message_id, group_header):
    import pytest
    monkeypatch = pytest.MonkeyPatch()
    message = Message(body=body, properties=properties or None)
    if group_id is not None:
        message.group_id = group_id
    if sequence is not None:
        message.group_sequence = sequence
    if ttl_ms:
        message.ttl = ttl_ms / 1000
    if address is not None:
        message.address = address
    if message_id is not None:
        message.id = message_id
    payload = message.encode()
    fast = _outcome(lambda: codec.read_arrival(payload, group_header, 1000))
    assert fast == _read_with_proton_only(payload, group_header, 1000, monkeypatch)


def test_group_id_comes_from_properties_then_jms_group_id():
    assert codec.read_arrival(Message(group_id="a", properties={"JMSXGroupID": "b"}).encode(), "", 0).group_id == "a"
    assert codec.read_arrival(Message(properties={"JMSXGroupID": "b"}).encode(), "", 0).group_id == "b"


def test_a_custom_group_header_replaces_both_defaults():
    payload = Message(group_id="a", properties={"JMSXGroupID": "b", "sym": "c"}).encode()
    assert codec.read_arrival(payload, "sym", 0).group_id == "c"
    assert codec.read_arrival(Message(group_id="a").encode(), "sym", 0).group_id is None


def test_a_non_string_group_id_is_an_invalid_field():
    import pytest
    with pytest.raises(InvalidField, match="must be a string, got int"):
        codec.read_arrival(Message(properties={"JMSXGroupID": 7}).encode(), "", 0)


def test_group_sequence_max_and_jms_sequence_minus_one_close_the_group():
    closing = Message(group_id="g")
    closing.group_sequence = 0xFFFFFFFF
    assert codec.read_arrival(closing.encode(), "", 0).closes_group
    assert codec.read_arrival(Message(group_id="g", properties={"JMSXGroupSeq": -1}).encode(), "", 0).closes_group
    assert not codec.read_arrival(Message(group_id="g", properties={"JMSXGroupSeq": 3}).encode(), "", 0).closes_group


def test_ttl_becomes_an_absolute_expiry_in_milliseconds():
    assert codec.read_arrival(Message(ttl=2.5).encode(), "", 1000).expires_at_ms == 3500
    assert codec.read_arrival(Message().encode(), "", 1000).expires_at_ms == 0


def test_garbage_is_an_invalid_field():
    import pytest
    for garbage in (b"", b"\x01\x02\x03", b"\x00\x53\x70\xff\xff", b"\x00\x53\x73\xc0\x05"):
        with pytest.raises(InvalidField, match="not valid AMQP 1.0"):
            codec.read_arrival(garbage, "", 0)


def test_a_redelivery_carries_its_delivery_count_and_the_first_key():
    rewritten = Message()
    rewritten.decode(codec.rewrite_for_delivery(Message(body="x", group_id="g").encode(), 2, "First"))
    assert (rewritten.delivery_count, rewritten.first_acquirer, rewritten.properties) == (2, False, {"First": True})


annotation_values = st.one_of(texts, st.integers(-2**31, 2**31 - 1), st.booleans())


@settings(max_examples=300, deadline=None)
@given(annotations=st.dictionaries(st.sampled_from(["x-opt-a", "x-opt-enqueued-time", "x-b", "k" * 200]),
                                   annotation_values, max_size=4),
       durable=st.booleans(), delivery_annotations=st.booleans(), group_id=st.one_of(st.none(), texts),
       body=st.one_of(st.binary(max_size=300), texts), enqueued_at_ms=st.integers(0, 2**62))
def test_the_enqueue_time_is_spliced_in_and_everything_else_decodes_unchanged(
        annotations, durable, delivery_annotations, group_id, body, enqueued_at_ms):
    from proton import symbol
    message = Message(body=body, durable=durable, group_id=group_id)
    if annotations:
        message.annotations = {symbol(key): value for key, value in annotations.items()}
    if delivery_annotations:
        message.instructions = {symbol("x-opt-route"): "somewhere"}
    payload = message.encode()

    stamped = Message()
    stamped.decode(codec.stamp_enqueued_time(payload, enqueued_at_ms))

    expected = {**annotations, "x-opt-enqueued-time": enqueued_at_ms}  # the producer's value is replaced
    assert {str(key): value for key, value in (stamped.annotations or {}).items()} == expected
    assert (stamped.body, stamped.durable, stamped.group_id) == (message.body, message.durable, message.group_id)
    assert (stamped.instructions or None) == (message.instructions or None)


def test_a_large_annotation_map_grows_into_a_map32_and_a_stamp_is_idempotent():
    from proton import symbol
    message = Message(body="b")
    message.annotations = {symbol("x-opt-big"): "v" * 240}  # a map8 with 30 bytes more needs a map32
    once = codec.stamp_enqueued_time(message.encode(), 5)
    twice = codec.stamp_enqueued_time(once, 7)
    decoded = Message()
    decoded.decode(twice)
    assert {str(key): value for key, value in decoded.annotations.items()} == {
        "x-opt-big": "v" * 240, "x-opt-enqueued-time": 7}


def test_a_symbolic_section_descriptor_is_stamped_through_proton():
    # an annotations section described by its symbolic name, which the splice does not read
    payload = bytes.fromhex("00a31c") + b"amqp:message-annotations:map" + bytes.fromhex("c10100") \
        + Message(body="b").encode()
    stamped = Message()
    stamped.decode(codec.stamp_enqueued_time(payload, 9))
    assert stamped.annotations[__import__("proton").symbol("x-opt-enqueued-time")] == 9


def test_payloads_rewritten_through_proton_are_bytes_which_pn_link_send_needs():
    # proton's Message.encode gives a bytearray; handed to pn_link_send it stopped the node (a fuzz case:
    # a section with a symbolic descriptor, which the splice does not read, went through proton)
    symbolic = b"amqp:amqp-value:*"
    payload = b"\x00\xa3" + bytes([len(symbolic)]) + symbolic + b"\xa1\x01x"
    assert type(codec.stamp_enqueued_time(payload, 5)) is bytes
    assert type(codec.rewrite_for_delivery(payload, 1, "first")) is bytes


def test_thousands_of_nested_descriptions_are_refused_as_invalid_not_a_recursion_error():
    # a crafted send: a properties section whose first field is 3,000 nested described values. Skipping
    # them recursed once per 0x00 and raised RecursionError, which is no GrouperError: it escaped the
    # arrival path. Now it is skipped in a loop and the truncated rest is an invalid field.
    payload = b"\x00\x53\x73" + b"\xc0\xff\x01" + b"\x00" * 3000 + b"\x40"
    with pytest.raises(InvalidField):
        codec.read_arrival(payload, "", 0)


def test_a_deeply_described_property_value_is_skipped_to_its_end():
    from node.amqp.type_encoding import skip_value
    nested = b"\x00\x53\x70" * 2000 + b"\x40"  # 2,000 descriptions around a null: one value
    assert skip_value(nested + b"\xa1\x01x", 0) == len(nested)
    described_descriptor = b"\x00\x00\xa3\x01d\x53\x01\xa1\x01v"  # a descriptor that is itself described
    assert skip_value(described_descriptor + b"\x40", 0) == len(described_descriptor)
