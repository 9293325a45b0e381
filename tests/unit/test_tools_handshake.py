"""The tools' SASL choices and their reading of a peer that is not AMQP (node/tools/handshake.py), and
the node's answer to an attach that may not create its queue (node/core/addresses.no_such_queue)."""

import pytest

from node.core.dispatch.addresses import no_such_queue
from node.tools.handshake import (SASL_HEADER, SILENT, HandshakeRefused, choose_mechanism, looks_like,
                                  not_amqp_text)

# what a gRPC (HTTP/2) server sends first: its SETTINGS frame, stream 0
HTTP2_SETTINGS = b"\x00\x00\x18\x04\x00\x00\x00\x00\x00\x00\x04\x00@\x00\x00"


def test_a_user_logs_in_with_scram_wherever_the_node_offers_it():
    assert choose_mechanism(["SCRAM-SHA-256"], "alice") == "SCRAM-SHA-256"
    assert choose_mechanism(["SCRAM-SHA-256", "PLAIN"], "alice") == "SCRAM-SHA-256"
    assert choose_mechanism(["PLAIN", "ANONYMOUS"], "alice") == "PLAIN"  # another broker, or an old node
    assert choose_mechanism(["SCRAM-SHA-256", "ANONYMOUS"], "") == "ANONYMOUS"


def test_a_missing_mechanism_names_what_is_offered_and_what_enables_the_one_needed():
    with pytest.raises(HandshakeRefused, match=r"offers SCRAM-SHA-256\).*--allow-anonymous"):
        choose_mechanism(["SCRAM-SHA-256"], "")
    with pytest.raises(HandshakeRefused, match="offers ANONYMOUS only.*leave out --user"):
        choose_mechanism(["ANONYMOUS"], "alice")
    with pytest.raises(HandshakeRefused, match="offers EXTERNAL, none that takes a password.*"
                                               "--sasl-plain-on-loopback"):
        choose_mechanism(["EXTERNAL"], "alice")


@pytest.mark.parametrize("answer, kind", [
    (HTTP2_SETTINGS, "HTTP/2"),
    (b"HTTP/1.1 400 Bad Request\r\n", "HTTP/1"),
    (b"\x15\x03\x01\x00\x02\x02\x46", "TLS"),
    (b"AMQP\x00\x01\x00\x00", "protocol id 0"),
    (b"SSH-2.0-", "no AMQP header"),
])
def test_a_peer_that_is_not_amqp_is_named_by_what_it_looks_like(answer, kind):
    assert kind in looks_like(answer)


def test_the_sasl_header_is_amqp():
    assert looks_like(SASL_HEADER) is None


def test_the_amqp_port_beside_the_admin_port_is_named_once_it_answers_like_one():
    asked = []

    def probe(host, port):
        asked.append(port)
        return port == 5672

    text = not_amqp_text("127.0.0.1", 5673, looks_like(HTTP2_SETTINGS), probe)
    assert text == ("127.0.0.1:5673 is not an AMQP port (it answered like an HTTP/2 server (a node's gRPC admin "
                    "port)); the AMQP port is 127.0.0.1:5672: give --node 127.0.0.1:5672")
    assert asked == [5672]
    assert "the AMQP port is 127.0.0.1:5672" in not_amqp_text("127.0.0.1", 5675, looks_like(b"HTTP/1.0 400"),
                                                               probe)


def test_a_port_silent_after_the_header_is_taken_for_an_http_port_and_its_amqp_port_probed():
    asked = []
    not_amqp_text("127.0.0.1", 5675, SILENT, lambda host, port: asked.append(port))
    assert asked == [5672]


def test_no_amqp_port_is_named_when_none_answers_beside_it():
    text = not_amqp_text("127.0.0.1", 9000, looks_like(HTTP2_SETTINGS), lambda host, port: False)
    assert "the AMQP port is 127" not in text and "`amqp:`" in text and "--node" in text


def test_an_unknown_queue_is_refused_with_the_names_close_to_it():
    assert no_such_queue("tradse", ["trades", "orders"]) == "no queue 'tradse' (did you mean 'trades'?)"
    assert no_such_queue("order", ["orders", "orders2", "x"]) == \
        "no queue 'order' (did you mean 'orders' or 'orders2'?)"
    assert no_such_queue("zzz", ["trades"]) == "no queue 'zzz'"
