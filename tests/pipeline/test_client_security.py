"""The pipeline's AMQP client (pipeline/amqp_client.py) against a real secured node, without Spark:
PLAIN over TLS, EXTERNAL with a client certificate, PLAIN on loopback, and the errors a wrong
password, an untrusted certificate or the wrong port give.

Rules of this file:
- Users and certificates come from the session's `security_files` (tests/pipeline/conftest.py).
- Logins that must fail go to a node of this module's own (`refusing_node`): the node holds back
  failed outcomes from the 4th failure in a row from one address, and the shared node must stay fast.
- Every wait is bounded by the client's own timeout (TIMEOUT_MS); refusals must come well before it.
"""

from __future__ import annotations

import time

import pytest

from pipeline import messages
from pipeline.amqp_client import Acquisition, AmqpConnection, AuthenticationFailed, ClientError, Sender, TlsFailed
from pipeline.security import Security
from tests.pipeline.conftest import SECURED_USER, amqps_address, start_secured_node

TIMEOUT_MS = 10_000
LINK_UNSETTLED_MAX = 1000  # the node's default link_unsettled_max
REFUSAL_MAX_S = 5.0  # a refused login or handshake is reported within this, not at the timeout


def plain_over_tls(files, **changes) -> Security:
    fields = {"user": SECURED_USER, "password_file": str(files.password_file), "tls": True,
              "ca_file": str(files.ca_file), **changes}
    return Security(**fields)


def certificate(files, pair=None) -> Security:
    cert_file, key_file = pair or files.client
    return Security(tls=True, ca_file=str(files.ca_file), cert_file=str(cert_file), key_file=str(key_file))


def send_all(address: str, security: Security, queue: str, bodies: list[tuple[str, bytes]], window: int = 500) -> int:
    connection = AmqpConnection(address, TIMEOUT_MS, f"send-{queue}", security)
    try:
        producer = Sender(connection, queue, f"send-{queue}", window)
        for group, body in bodies:
            producer.send(messages.encode(group, body))
        producer.flush()
        return producer.accepted
    finally:
        connection.close()


def take_all(address: str, security: Security, queue: str, count: int, browse: bool = False) -> list[tuple]:
    """Up to `count` messages, in rounds: a group stays on its link while unsettled there, so a drain
    takes what one link holds (LINK_UNSETTLED_MAX) and accepts it before the next round."""
    connection = AmqpConnection(address, TIMEOUT_MS, f"take-{queue}", security)
    rows: list[tuple] = []
    try:
        acquisition = Acquisition(connection, queue, browse, link_unsettled_max=LINK_UNSETTLED_MAX, links_max=1,
                                  name=f"take-{queue}")
        while len(rows) < count:
            taken = acquisition.take(min(count - len(rows), LINK_UNSETTLED_MAX), idle_timeout_ms=2000)
            if not taken:
                break
            rows += [messages.decode(item.payload) for item in taken]
            if browse:
                break  # a browser's copies do not advance
            acquisition.accept(taken)
        return rows
    finally:
        connection.close()


def refused(error_type, address: str, security: Security) -> str:
    """Open a connection and attach a producer, which must fail with `error_type`, soon; its text."""
    began = time.monotonic()
    with pytest.raises(error_type) as failure:
        connection = AmqpConnection(address, TIMEOUT_MS, "refused", security)
        try:
            Sender(connection, "refused", "refused", 10)
        finally:
            connection.close()
    assert time.monotonic() - began < REFUSAL_MAX_S, "the refusal came only at the timeout"
    return str(failure.value)


@pytest.fixture(scope="module")
def refusing_node(tmp_path_factory, security_files):
    node = start_secured_node(tmp_path_factory.mktemp("refusing") / "node", security_files)
    yield node
    node.kill()


# ---- logins that work ---------------------------------------------------------------------------

def test_plain_over_tls_sends_and_takes_back_thousands_of_messages_in_group_order(secured_node, security_files):
    address, security = amqps_address(secured_node), plain_over_tls(security_files)
    bodies = [(f"g{seq % 7}", f"{seq:06d}".encode() * 100) for seq in range(3000)]  # 600 B each: many TLS records

    assert send_all(address, security, "tls-plain", bodies) == 3000
    rows = take_all(address, security, "tls-plain", 3000)

    assert len(rows) == 3000
    for group in {group for group, _ in bodies}:
        assert [row[1] for row in rows if row[0] == group] == [body for g, body in bodies if g == group]


def test_external_with_a_client_certificate_sends_and_browses(secured_node, security_files):
    address, security = amqps_address(secured_node), certificate(security_files)

    assert send_all(address, security, "tls-external", [("g", b"one"), ("g", b"two")]) == 2

    assert [row[1] for row in take_all(address, security, "tls-external", 10, browse=True)] == [b"one", b"two"]


def test_plain_on_the_loopback_port_without_tls_when_the_node_allows_it(secured_node, security_files):
    security = Security(user=SECURED_USER, password_file=str(security_files.password_file))

    assert send_all(secured_node.amqp_address, security, "loopback-plain", [("g", b"x")]) == 1


def test_a_password_from_an_environment_variable_logs_in(secured_node, security_files, monkeypatch):
    monkeypatch.setenv("GROUPER_TEST_PASSWORD", security_files.password_file.read_text().rstrip("\n"))
    security = plain_over_tls(security_files, password_file="", password_env="GROUPER_TEST_PASSWORD")

    assert send_all(amqps_address(secured_node), security, "tls-env", [("g", b"x")]) == 1


# ---- refusals say who and what to do ---------------------------------------------------------------

def test_a_wrong_password_raises_an_error_naming_the_node_the_user_and_what_to_check(refusing_node, tmp_path,
                                                                                     security_files):
    wrong = tmp_path / "wrong-password"
    wrong.write_text("not the password\n")
    address = amqps_address(refusing_node)

    text = refused(AuthenticationFailed, address, plain_over_tls(security_files, password_file=str(wrong)))

    assert address in text and f"user {SECURED_USER!r}" in text
    assert str(wrong) in text and "grouper user" in text


def test_an_untrusted_node_certificate_raises_a_tls_error_naming_the_ca_file(refusing_node, security_files):
    address = amqps_address(refusing_node)

    text = refused(TlsFailed, address, plain_over_tls(security_files, ca_file=str(security_files.other_ca_file)))

    assert address in text and str(security_files.other_ca_file) in text and "certificate" in text


def test_a_client_certificate_of_another_ca_raises_a_tls_error_naming_it(refusing_node, security_files):
    text = refused(TlsFailed, amqps_address(refusing_node), certificate(security_files, security_files.stranger))

    assert str(security_files.stranger[0]) in text and "tls_ca_file" in text


def test_an_anonymous_client_is_told_to_give_credentials(refusing_node):
    text = refused(AuthenticationFailed, refusing_node.amqp_address, Security())

    assert refusing_node.amqp_address in text and "passwordFile" in text and "certFile" in text


def test_tls_to_the_plain_port_asks_whether_it_is_the_amqps_port(refusing_node, security_files):
    text = refused(TlsFailed, refusing_node.amqp_address, plain_over_tls(security_files))

    assert "amqps" in text


def test_no_tls_to_the_amqps_port_says_to_set_tls(refusing_node, security_files):
    text = refused(ClientError, amqps_address(refusing_node),
                   Security(user=SECURED_USER, password_file=str(security_files.password_file)))

    assert "set tls to true" in text
