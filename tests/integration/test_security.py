"""AMQP security of a real node, black box: who gets in (SASL), what each user may do (links, and
messages on an anonymous relay), TLS, and the limits a client meets before it has authenticated.

Clients: python-qpid-proton's blocking API (PLAIN, ANONYMOUS, EXTERNAL), a raw socket for SCRAM-SHA-256
and for the exchanges no client library makes (sasl_socket.py), and rhea under Node.js.

Rules of this file:
- Users and roles are made once per module with the CLI (`grouper role set`, `grouper user add
  --password-stdin`); a test that edits them gets its own copy of the users file.
- The node's failure throttle counts per source address (and user), and every client here is
  127.0.0.1, so a test that makes failed attempts gets a node of its own; the module's shared node
  (`secured`) sees only successful logins and serves the authorization tests.
- Every wait is bounded. The only timing assertions are lower bounds (the throttle's delay, the
  handshake deadline not firing early).
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import signal
import socket
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
from proton import ConnectionException, Delivery, Endpoint, Message, SSLDomain
from proton.utils import BlockingConnection, LinkDetached

from node import certs
from tests.integration.cli import grouper, grouper_ok, write_users_file
from tests.integration import harness
from tests.integration.harness import WAIT_S, ManualReceiver, NodeProcess, send_outcome
from tests.integration.sasl_socket import (AMQP_HEADER, OUTCOME_AUTH, OUTCOME_OK, OUTCOME_SYS, SASL_HEADER,
                                           SaslSocket, plain_response, sasl_init)
from tests.interop.rhea_client import RheaClient, ensure_rhea_installed

PASSWORD = "correct horse battery"
UNAUTHORIZED = "amqp:unauthorized-access"
ROLES = {"writer": "send:orders.*", "reader": "consume:orders.#", "browser": "browse:orders.*"}
USERS = {"writer": "writer", "reader": "reader", "browser": "browser", "admin": "administrator"}
QUEUES = ("orders.x", "orders.y", "orders.a.b", "billing")  # declared; auto-create stays on, so create is checked
QUEUES_CONFIG = "".join(f'[[queue]]\nname = "{name}"\n\n' for name in QUEUES)
RETRY_INTERVAL_S = 0.2  # between attempts while waiting for a reload; failed logins are throttled after 3
THROTTLE_DELAY_MIN_S = 0.25  # node/core/access/failed_logins.py: the 4th failure in a row is held 250 ms, doubling


# ---- the CLI, users and certificates -----------------------------------------------------------


@pytest.fixture(scope="module")
def users_file(tmp_path_factory) -> Path:
    return write_users_file(tmp_path_factory.mktemp("users") / "users.json", ROLES, USERS, PASSWORD)


@pytest.fixture
def own_users_file(tmp_path, users_file) -> Path:
    """A copy of the module's users file for a test that edits it."""
    return Path(shutil.copy(users_file, tmp_path / "own-users.json"))


@dataclass(frozen=True)
class Certificates:
    ca: Path  # the node's CA: signs the node's certificate and the client certificates it accepts
    other_ca: Path  # a CA the node does not trust
    node: tuple[Path, Path]  # certificate and key for "localhost"

    def client(self, name: str, ca: Path | None = None) -> tuple[Path, Path]:
        return certs.leaf_paths(ca or self.ca, name)


def make_node_certificate(directory: Path) -> tuple[Path, Path]:
    return certs.make_leaf(directory, "localhost", ips=("127.0.0.1",))


@pytest.fixture(scope="module")
def certificates(tmp_path_factory) -> Certificates:
    ca, other_ca = tmp_path_factory.mktemp("ca"), tmp_path_factory.mktemp("other-ca")
    certs.make_ca(ca)
    certs.make_ca(other_ca)
    node_pair = make_node_certificate(ca)
    certs.make_leaf(ca, "writer", client_only=True)
    certs.make_leaf(other_ca, "writer", client_only=True)
    certs.make_leaf(ca, "stranger", client_only=True)  # trusted, but no user of that name
    now = datetime.datetime.now(datetime.timezone.utc)
    certs.make_leaf(ca, "expired", client_only=True, not_before=now - datetime.timedelta(days=30),
                    not_after=now - datetime.timedelta(days=1))
    return Certificates(ca, other_ca, node_pair)


# ---- nodes -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def secured(tmp_path_factory, users_file):
    """The module's shared node: the users file, PLAIN on loopback, the QUEUES. Only successful logins."""
    node = NodeProcess(tmp_path_factory.mktemp("secured") / "node", QUEUES_CONFIG,
                       ("--users-file", str(users_file), "--sasl-plain-on-loopback"))
    try:
        yield node.start()
    finally:
        node.kill()


def start_secured(node_factory, users_file: Path, *args: str, config: str = "") -> NodeProcess:
    """A node of the test's own, with the users file and the QUEUES."""
    return node_factory(config + QUEUES_CONFIG, "--users-file", str(users_file), *args)


def start_tls(node_factory, tmp_path: Path, users_file: Path, certificates: Certificates,
              config: str = "") -> NodeProcess:
    """A node serving AMQP over TLS too, with its own copies of its certificate and key (a test may
    replace them); client certificates of `certificates.ca` are accepted."""
    cert_file, key_file = (Path(shutil.copy(path, tmp_path / path.name)) for path in certificates.node)
    return start_secured(node_factory, users_file, "--tls-cert-file", str(cert_file), "--tls-key-file",
                         str(key_file), "--tls-ca-file", str(certificates.ca / certs.CA_CERT_FILE),
                         "--amqps-port", "0", config=config)


# ---- clients -----------------------------------------------------------------------------------


def login(address: str, user: str | None, password: str = PASSWORD, *, mechanism: str = "PLAIN",
          scheme: str = "amqp", **options) -> BlockingConnection:
    credentials = {"user": user, "password": password} if user is not None else {}
    return BlockingConnection(f"{scheme}://{address}", timeout=WAIT_S, allowed_mechs=mechanism,
                              allow_insecure_mechs=True, **credentials, **options)


def refused(open_connection) -> str:
    """Run `open_connection()`, which must fail; proton's account of why."""
    with pytest.raises(ConnectionException) as refusal:
        open_connection().close()
    return str(refusal.value)


def assert_authentication_failed(proton_error: str) -> None:
    # proton reports any failed SASL exchange so: a bad password, or no mechanism it may use
    assert UNAUTHORIZED in proton_error and "Authentication failed" in proton_error, proton_error


def tls_domain(ca: Path, client: tuple[Path, Path] | None = None) -> SSLDomain:
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(str(ca / certs.CA_CERT_FILE))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
    if client is not None:
        domain.set_credentials(str(client[0]), str(client[1]), None)
    return domain


def tls_login(node: NodeProcess, user: str | None, ca: Path, *, client=None, mechanism="PLAIN") -> BlockingConnection:
    # the node's certificate names localhost; the node listens on 127.0.0.1
    return login(node.amqps_address, user, mechanism=mechanism, scheme="amqps", ssl_domain=tls_domain(ca, client),
                 sni="localhost")


def link_outcome(connection: BlockingConnection, permission: str, address: str):
    """Attach a producer ("send"), consumer ("consume") or browser ("browse") to `address`: None if the
    node keeps the link (proved by a round trip on it), else the condition of the node's detach."""
    try:
        if permission == "send":
            link = connection.create_sender(address).link
        else:
            link = ManualReceiver(connection, address, f"{permission}-{address}", browse=permission == "browse").link
    except LinkDetached as error:
        return error.link.remote_condition
    if permission == "send":  # the node grants a producer credit right after its attach
        connection.wait(lambda: link.state & Endpoint.REMOTE_CLOSED or link.credit > 0, timeout=WAIT_S,
                        msg=f"credit or a detach on the producer to {address}")
    else:  # a drain: the node answers with a flow, or the link is already detached
        link.drain(1)
        connection.wait(lambda: link.state & Endpoint.REMOTE_CLOSED or not link.draining(), timeout=WAIT_S,
                        msg=f"the drained flow or a detach on the {permission} link to {address}")
    if link.state & Endpoint.REMOTE_CLOSED:
        assert link.remote_condition is not None, f"{permission} link to {address} detached without a condition"
        return link.remote_condition
    return None


def assert_denied(condition, user: str, permission: str, queue: str) -> None:
    assert condition is not None and condition.name == UNAUTHORIZED, condition
    description = condition.description
    assert f"user {user!r}" in description and permission in description and f"queue {queue!r}" in description, \
        description


def relay_outcome(sender, to: str):
    """Send one message addressed `to` on an anonymous-relay link: (state, condition)."""
    delivery = sender.link.send(Message(body=f"for {to}", address=to, group_id="g"))
    sender.connection.wait(lambda: delivery.settled, timeout=WAIT_S, msg=f"the outcome of a message to {to}")
    state, condition = delivery.remote_state, delivery.remote.condition
    delivery.settle()
    return state, condition


def queue_names(node: NodeProcess) -> list[str]:
    """`grouper queue list` against the node, as the administrator (the environment carries the credentials
    for a management API that asks for them)."""
    listed = grouper_ok("queue", "list", "--json", "--node", node.admin_address,
                        env={"GROUPER_USER": "admin", "GROUPER_PASSWORD": PASSWORD})
    return [queue["name"] for queue in json.loads(listed)]


def log_after_one_more_refusal(node: NodeProcess) -> list[str]:
    """The node's output once it has logged refusing a client without SASL, opened after everything the
    test did before: a barrier for what the node logs about earlier clients. Once per node (the node
    logs a reason once per address)."""
    with SaslSocket(node.amqp_address) as raw:
        raw.send(AMQP_HEADER)
        assert raw.closed_by_node()[0]
    wait_until(lambda: any("opened without SASL" in line for line in node.output),
               "the node logging the refusal of a client without SASL")
    return list(node.output)


def wait_until(attempt, what: str, timeout_s: float = WAIT_S):
    """The harness's wait, trying every RETRY_INTERVAL_S (failed logins are throttled after 3)."""
    return harness.wait_until(attempt, what, timeout_s, RETRY_INTERVAL_S)


# ---- 1. defaults: no users file --------------------------------------------------------------------


@pytest.mark.parametrize("sasl_enabled", [True, False], ids=["sasl-anonymous", "no-sasl"])
def test_a_node_without_users_on_loopback_is_open_and_anonymous_clients_send_and_receive(node_factory, sasl_enabled):
    node = node_factory(QUEUES_CONFIG)
    assert any(line.startswith("security: open") for line in node.output), node.output

    connection = BlockingConnection(node.url, timeout=WAIT_S, sasl_enabled=sasl_enabled)
    try:
        sender = connection.create_sender("billing")
        assert send_outcome(sender, Message(body="open", group_id="g")) == (Delivery.ACCEPTED, None)
        held = ManualReceiver(connection, "billing", "consumer").fetch()
        assert held.body == "open"
        held.accept()
    finally:
        connection.close()


def test_a_node_without_users_refuses_to_start_on_a_non_loopback_host_and_names_the_fixes(tmp_path):
    result = grouper("node", "--host", "0.0.0.0", "--data-dir", str(tmp_path / "data"), "--amqp-port", "0",
                     "--admin-port", "0", "--http-port", "0")
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "--allow-anonymous" in output and "grouper user add" in output, output
    assert "ready" not in result.stdout


def test_allow_anonymous_lets_a_node_without_users_serve_a_non_loopback_host(node_factory):
    node = node_factory("", "--host", "0.0.0.0", "--allow-anonymous")
    assert any(line.startswith("security: open") for line in node.output), node.output
    port = node.amqp_address.rsplit(":", 1)[1]
    connection = BlockingConnection(f"amqp://127.0.0.1:{port}", timeout=WAIT_S)
    try:
        sender = connection.create_sender("anything")
        assert send_outcome(sender, Message(body="in", group_id="g")) == (Delivery.ACCEPTED, None)
    finally:
        connection.close()


# ---- 2. authentication with a users file ---------------------------------------------------------


def test_the_banner_says_the_node_is_secured_by_its_users_file(secured, users_file):
    assert f"security: secured: {len(USERS)} users in {users_file}" in secured.output, secured.output


def test_plain_over_tcp_is_not_offered_without_sasl_plain_on_loopback(node_factory, users_file):
    node = start_secured(node_factory, users_file)

    assert_authentication_failed(refused(lambda: login(node.amqp_address, "admin")))
    with SaslSocket(node.amqp_address) as raw:
        assert raw.mechanisms() == ["SCRAM-SHA-256"]
        raw.send(sasl_init("PLAIN", plain_response("admin", PASSWORD)))
        assert raw.outcome()[0] == OUTCOME_AUTH
        assert raw.closed_by_node()[0]


def test_plain_with_sasl_plain_on_loopback_lets_a_user_in_to_send_and_receive(secured):
    connection = login(secured.amqp_address, "admin")
    try:
        sender = connection.create_sender("billing")
        assert send_outcome(sender, Message(body="plain", group_id="g")) == (Delivery.ACCEPTED, None)
        held = ManualReceiver(connection, "billing", "consumer").fetch()
        assert held.body == "plain"
        held.accept()
    finally:
        connection.close()


def test_a_wrong_password_and_an_unknown_user_both_fail_authentication(node_factory, users_file):
    node = start_secured(node_factory, users_file, "--sasl-plain-on-loopback")

    assert_authentication_failed(refused(lambda: login(node.amqp_address, "writer", "not the password")))
    assert_authentication_failed(refused(lambda: login(node.amqp_address, "nobody")))
    login(node.amqp_address, "writer").close()  # the node itself is fine


def test_anonymous_is_refused_beside_a_users_file(node_factory, users_file):
    node = start_secured(node_factory, users_file, "--sasl-plain-on-loopback")

    assert_authentication_failed(refused(lambda: login(node.amqp_address, None, mechanism="ANONYMOUS")))
    with SaslSocket(node.amqp_address) as raw:
        assert "ANONYMOUS" not in raw.mechanisms()
        raw.send(sasl_init("ANONYMOUS", b"guest"))
        assert raw.outcome()[0] == OUTCOME_AUTH
        assert raw.closed_by_node()[0]


def test_a_client_without_sasl_is_answered_with_the_sasl_header_and_closed(node_factory, users_file):
    node = start_secured(node_factory, users_file, "--sasl-plain-on-loopback")

    with SaslSocket(node.amqp_address) as raw:
        raw.send(AMQP_HEADER)
        closed, answer = raw.closed_by_node()
        assert closed and answer == SASL_HEADER
    with pytest.raises(ConnectionException):
        BlockingConnection(node.url, timeout=WAIT_S, sasl_enabled=False).close()


def test_scram_sha_256_over_a_socket_authenticates_and_the_node_then_speaks_amqp(secured):
    with SaslSocket(secured.amqp_address) as raw:
        assert raw.scram("reader", PASSWORD) == OUTCOME_OK
        assert raw.amqp_header_answered() == AMQP_HEADER


@pytest.mark.parametrize("user, password", [("reader", "not the password"), ("nobody", PASSWORD)],
                         ids=["wrong-password", "unknown-user"])
def test_scram_sha_256_with_a_wrong_password_or_unknown_user_fails(node_factory, users_file, user, password):
    node = start_secured(node_factory, users_file)
    with SaslSocket(node.amqp_address) as raw:
        assert raw.scram(user, password) == OUTCOME_AUTH
        assert raw.closed_by_node()[0]


def test_with_allow_anonymous_anonymous_clients_get_the_anonymous_roles_of_the_users_file(node_factory,
                                                                                          own_users_file):
    grouper_ok("user", "roles", "anonymous", "--role", "browser", "--users-file", str(own_users_file))
    node = start_secured(node_factory, own_users_file, "--allow-anonymous")

    connection = login(node.amqp_address, None, mechanism="ANONYMOUS")
    try:
        assert link_outcome(connection, "browse", "orders.x") is None
        condition = link_outcome(connection, "send", "orders.x")
        assert condition is not None and condition.name == UNAUTHORIZED, condition
        assert "anonymous" in condition.description and "'orders.x'" in condition.description
    finally:
        connection.close()


# ---- 3. authorization --------------------------------------------------------------------------

MATRIX = [  # (user, permission, queue, allowed) over ROLES: * is one word, # any number
    ("writer", "send", "orders.x", True),
    ("writer", "send", "orders.a.b", False),
    ("writer", "send", "billing", False),
    ("writer", "consume", "orders.x", False),
    ("writer", "browse", "orders.x", False),
    ("reader", "consume", "orders.x", True),
    ("reader", "consume", "orders.a.b", True),
    ("reader", "consume", "billing", False),
    ("reader", "browse", "orders.x", False),
    ("reader", "send", "orders.x", False),
    ("browser", "browse", "orders.y", True),
    ("browser", "browse", "orders.a.b", False),
    ("browser", "consume", "orders.y", False),
    ("browser", "send", "orders.y", False),
    ("admin", "send", "billing", True),
    ("admin", "consume", "orders.a.b", True),
    ("admin", "browse", "billing", True),
]


@pytest.mark.parametrize("user, permission, queue, allowed", MATRIX,
                         ids=[f"{u}-{p}-{q}-{'allowed' if a else 'denied'}" for u, p, q, a in MATRIX])
def test_a_user_may_open_exactly_the_links_its_roles_grant(secured, user, permission, queue, allowed):
    connection = login(secured.amqp_address, user)
    try:
        condition = link_outcome(connection, permission, queue)
    finally:
        connection.close()
    if allowed:
        assert condition is None, condition
    else:
        assert_denied(condition, user, permission, queue)


@pytest.mark.parametrize("user, permission, queue", [("writer", "send", "orders.new"),
                                                     ("reader", "consume", "orders.fresh")])
def test_a_link_to_a_missing_queue_is_denied_without_create_and_the_queue_is_not_made(secured, user, permission,
                                                                                      queue):
    connection = login(secured.amqp_address, user)
    try:
        assert_denied(link_outcome(connection, permission, queue), user, "create", queue)
    finally:
        connection.close()
    assert queue not in queue_names(secured)


def test_an_administrator_attaching_to_a_missing_queue_creates_it(secured):
    connection = login(secured.amqp_address, "admin")
    try:
        assert link_outcome(connection, "send", "scratch.made") is None
    finally:
        connection.close()
    assert "scratch.made" in queue_names(secured)


def test_an_anonymous_relay_link_refuses_each_message_to_a_queue_the_user_may_not_send_to(secured):
    connection = login(secured.amqp_address, "writer")
    try:
        relay = connection.create_sender(None)
        assert relay_outcome(relay, "orders.x") == (Delivery.ACCEPTED, None)
        for forbidden in ("billing", "orders.a.b"):
            state, condition = relay_outcome(relay, forbidden)
            assert state == Delivery.REJECTED
            assert_denied(condition, "writer", "send", forbidden)
        state, condition = relay_outcome(relay, "orders.unmade")  # send matches, create does not
        assert state == Delivery.REJECTED
        assert_denied(condition, "writer", "create", "orders.unmade")
        assert relay_outcome(relay, "orders.y") == (Delivery.ACCEPTED, None)  # the link goes on
    finally:
        connection.close()
    assert "orders.unmade" not in queue_names(secured)


# ---- 4. reload of the users file -----------------------------------------------------------------


def test_a_user_added_while_the_node_runs_gets_in_and_once_deleted_no_longer_does(node_factory, own_users_file):
    node = start_secured(node_factory, own_users_file, "--sasl-plain-on-loopback")

    def carol_gets_in():
        try:
            return login(node.amqp_address, "carol")
        except ConnectionException:
            return None

    assert carol_gets_in() is None
    write_users_file(own_users_file, {}, {"carol": "writer"}, PASSWORD)
    carol = wait_until(carol_gets_in, "the node taking in the added user carol")
    try:
        sender = carol.create_sender("orders.x")
        assert send_outcome(sender, Message(body="by carol", group_id="g")) == (Delivery.ACCEPTED, None)

        grouper_ok("user", "delete", "carol", "--users-file", str(own_users_file))

        def carol_refused():
            connection = carol_gets_in()
            if connection is not None:
                connection.close()
            return connection is None
        wait_until(carol_refused, "the node dropping the deleted user carol")
        # a connection already in keeps what it was granted (node/security.py)
        assert send_outcome(sender, Message(body="still carol", group_id="g")) == (Delivery.ACCEPTED, None)
    finally:
        carol.close()


# ---- 5. TLS --------------------------------------------------------------------------------------


def test_plain_over_tls_lets_a_user_in_where_plain_tcp_offers_only_scram(node_factory, tmp_path, users_file,
                                                                         certificates):
    node = start_tls(node_factory, tmp_path, users_file, certificates)
    assert node.amqps_address, node.output

    connection = tls_login(node, "admin", certificates.ca)
    try:
        sender = connection.create_sender("billing")
        assert send_outcome(sender, Message(body="over tls", group_id="g")) == (Delivery.ACCEPTED, None)
    finally:
        connection.close()
    with SaslSocket(node.amqp_address) as raw:  # no --sasl-plain-on-loopback
        assert raw.mechanisms() == ["SCRAM-SHA-256"]
    warnings = [line for line in log_after_one_more_refusal(node) if "WARNING asyncio" in line]
    assert warnings == [], warnings  # a TLS client closing is routine


def test_external_names_the_user_of_the_client_certificate_and_grants_that_users_permissions(
        node_factory, tmp_path, users_file, certificates):
    node = start_tls(node_factory, tmp_path, users_file, certificates)

    connection = tls_login(node, None, certificates.ca, client=certificates.client("writer"), mechanism="EXTERNAL")
    try:
        assert link_outcome(connection, "send", "orders.x") is None
        assert_denied(link_outcome(connection, "consume", "orders.x"), "writer", "consume", "orders.x")
    finally:
        connection.close()


def test_external_with_a_trusted_certificate_naming_no_user_is_refused_at_login(node_factory, tmp_path, users_file,
                                                                                 certificates):
    node = start_tls(node_factory, tmp_path, users_file, certificates)

    error = refused(lambda: tls_login(node, None, certificates.ca, client=certificates.client("stranger"),
                                      mechanism="EXTERNAL"))
    assert "SSL" not in error, error  # the handshake passed: SASL offered no EXTERNAL to a name without a user


@pytest.mark.parametrize("signer, name", [("other_ca", "writer"), ("ca", "expired")],
                         ids=["signed-by-another-ca", "expired"])
def test_a_client_certificate_the_node_does_not_accept_fails_the_handshake(node_factory, tmp_path, users_file,
                                                                          certificates, signer, name):
    node = start_tls(node_factory, tmp_path, users_file, certificates)
    client = certificates.client(name, getattr(certificates, signer))

    error = refused(lambda: tls_login(node, None, certificates.ca, client=client, mechanism="EXTERNAL"))
    assert "SSL" in error, error  # the TLS handshake failed, not the SASL exchange after it
    tls_login(node, "writer", certificates.ca).close()  # the same client without that certificate gets in


def test_a_plain_amqp_client_on_the_tls_port_is_refused(node_factory, tmp_path, users_file, certificates):
    node = start_tls(node_factory, tmp_path, users_file, certificates)

    refused(lambda: login(node.amqps_address, "admin"))
    with SaslSocket(node.amqps_address) as raw:
        raw.send(SASL_HEADER)
        closed, answer = raw.closed_by_node()
        assert closed and not answer.startswith(b"AMQP"), answer


def engine_connections(node: NodeProcess) -> float:
    """The node's grouper_engine_connections: proton connections it holds (released or not)."""
    with urllib.request.urlopen(f"http://{node.http_address}/metrics", timeout=WAIT_S) as reply:
        text = reply.read().decode()
    return next(float(line.split()[1]) for line in text.splitlines() if line.startswith("grouper_engine_connections "))


def test_failed_and_abandoned_tls_handshakes_leave_nothing_behind(node_factory, tmp_path, users_file, certificates):
    node = start_tls(node_factory, tmp_path, users_file, certificates)
    host, port = node.amqps_address.rsplit(":", 1)
    for attempt in range(20):  # each held a proton connection for ever before (asyncio never reports them)
        with socket.create_connection((host, int(port)), timeout=WAIT_S) as raw:
            if attempt % 2:
                raw.sendall(SASL_HEADER)  # not TLS: the handshake fails
                raw.recv(100)
    wait_until(lambda: engine_connections(node) == 0 or None, "no proton connection left")
    connection = tls_login(node, "admin", certificates.ca)  # a real TLS client still gets in
    try:
        assert connection.create_sender("orders.x") is not None
        assert engine_connections(node) == 1
    finally:
        connection.close()


def test_tls_handshakes_in_progress_count_toward_the_connections_per_address(node_factory, tmp_path, users_file,
                                                                              certificates):
    node = start_tls(node_factory, tmp_path, users_file, certificates,
                     # a handshake timeout longer than any wait here: only the count can close the 4th
                     config="[node]\nconnections_per_address_max = 3\nhandshake_timeout_ms = 120000\n")
    host, port = node.amqps_address.rsplit(":", 1)
    stalled = [socket.create_connection((host, int(port)), timeout=WAIT_S) for _ in range(3)]  # say nothing
    try:
        def fourth_closed_at_once():
            with socket.create_connection((host, int(port)), timeout=WAIT_S) as fourth:
                return fourth.recv(100) == b""  # the node closes it unread: no TLS alert, no handshake
        # the first three are counted from their accept (the node may see them a moment after connect())
        wait_until(fourth_closed_at_once, "a 4th socket from this address closed before any handshake")
        # the node logs the refusal as it closes the socket; its line reaches node.output a moment later
        wait_until(lambda: any("3 connections are open from this address" in line for line in node.output),
                   "the node's log line naming the refused 4th connection")
    finally:
        for raw in stalled:
            raw.close()
    # their slots end with them: a TLS client gets in again
    connection = wait_until(lambda: _tls_login_or_none(node, certificates.ca), "a TLS login after the close")
    connection.close()


def _tls_login_or_none(node: NodeProcess, ca: Path):
    try:
        return tls_login(node, "admin", ca)
    except ConnectionException:
        return None


def test_a_tls_client_on_the_plain_port_is_refused(node_factory, tmp_path, users_file, certificates):
    node = start_tls(node_factory, tmp_path, users_file, certificates)

    error = refused(lambda: login(node.amqp_address, "admin", scheme="amqps",
                                  ssl_domain=tls_domain(certificates.ca), sni="localhost"))
    assert "SSL" in error, error


def new_ca_with_node_certificate(directory: Path) -> tuple[Path, tuple[Path, Path]]:
    directory.mkdir()
    certs.make_ca(directory)
    return directory, make_node_certificate(directory)


def replace_file(source: Path, target: Path) -> None:
    staged = target.with_name(target.name + ".new")
    shutil.copy(source, staged)
    os.replace(staged, target)  # whole, never half written


def test_after_sighup_the_node_serves_a_new_certificate(node_factory, tmp_path, users_file, certificates):
    node = start_tls(node_factory, tmp_path, users_file, certificates)
    new_ca, new_pair = new_ca_with_node_certificate(tmp_path / "new-ca")
    refused(lambda: tls_login(node, "admin", new_ca))  # still the old certificate

    for new_file, served_file in zip(new_pair, certificates.node):
        replace_file(new_file, tmp_path / served_file.name)
    node.process.send_signal(signal.SIGHUP)

    def new_ca_trusted():
        try:
            return tls_login(node, "admin", new_ca)
        except ConnectionException:
            return None
    wait_until(new_ca_trusted, "a client trusting only the new CA getting in").close()
    refused(lambda: tls_login(node, "admin", certificates.ca))


def test_a_certificate_that_does_not_match_its_key_is_not_taken_and_the_old_one_is_served(
        node_factory, tmp_path, users_file, certificates):
    node = start_tls(node_factory, tmp_path, users_file, certificates)
    _, (new_certificate, _) = new_ca_with_node_certificate(tmp_path / "new-ca")

    replace_file(new_certificate, tmp_path / certificates.node[0].name)  # its key stays the old one
    node.process.send_signal(signal.SIGHUP)
    wait_until(lambda: any("TLS files not reloaded" in line for line in node.output),
               "the node refusing a certificate without its key")

    tls_login(node, "admin", certificates.ca).close()


# ---- 6. limits before authentication -------------------------------------------------------------

HANDSHAKE_TIMEOUT_MS = 500


def stall_silent(raw: SaslSocket) -> None:
    pass


def stall_after_the_sasl_header(raw: SaslSocket) -> None:
    raw.mechanisms()


def stall_before_the_amqp_open(raw: SaslSocket) -> None:
    assert raw.plain("writer", PASSWORD) == OUTCOME_OK
    assert raw.amqp_header_answered() == AMQP_HEADER


@pytest.mark.parametrize("stall", [stall_silent, stall_after_the_sasl_header, stall_before_the_amqp_open],
                         ids=["sends-nothing", "after-the-sasl-header", "authenticated-without-open"])
def test_a_client_that_does_not_open_within_handshake_timeout_ms_is_closed(node_factory, users_file, stall):
    node = start_secured(node_factory, users_file, "--sasl-plain-on-loopback",
                         config=f"[node]\nhandshake_timeout_ms = {HANDSHAKE_TIMEOUT_MS}\n\n")
    started = time.monotonic()
    with SaslSocket(node.amqp_address) as raw:
        stall(raw)
        closed, _ = raw.closed_by_node(timeout_s=WAIT_S)
        elapsed_s = time.monotonic() - started
    assert closed, f"the node kept a stalled client for {WAIT_S} s"
    assert elapsed_s >= HANDSHAKE_TIMEOUT_MS / 1000 - 0.01, f"closed after {elapsed_s:.3f} s"


def test_a_client_that_stalls_in_the_tls_handshake_is_closed_after_handshake_timeout_ms(
        node_factory, tmp_path, users_file, certificates):
    node = start_tls(node_factory, tmp_path, users_file, certificates,
                     config=f"[node]\nhandshake_timeout_ms = {HANDSHAKE_TIMEOUT_MS}\n\n")
    started = time.monotonic()
    with SaslSocket(node.amqps_address) as raw:
        closed, _ = raw.closed_by_node(timeout_s=WAIT_S)
        elapsed_s = time.monotonic() - started
    assert closed, f"the node kept a client silent in the TLS handshake for {WAIT_S} s"
    assert elapsed_s >= HANDSHAKE_TIMEOUT_MS / 1000 - 0.01, f"closed after {elapsed_s:.3f} s"
    tls_login(node, "admin", certificates.ca).close()  # the listener serves on


def test_a_sasl_frame_over_sasl_frame_max_bytes_is_refused_and_the_socket_closed(node_factory, users_file):
    node = start_secured(node_factory, users_file, "--sasl-plain-on-loopback",
                         config="[node]\nsasl_frame_max_bytes = 512\n\n")
    with SaslSocket(node.amqp_address) as raw:  # under the limit: read, and the password is merely wrong
        raw.mechanisms()
        raw.send(sasl_init("PLAIN", plain_response("writer", "x" * 400)))
        assert raw.outcome()[0] == OUTCOME_AUTH
    with SaslSocket(node.amqp_address) as raw:
        raw.mechanisms()
        raw.send(sasl_init("PLAIN", plain_response("writer", "x" * 600)))
        assert raw.outcome()[0] == OUTCOME_SYS
        assert raw.closed_by_node()[0]


def test_a_connection_over_connections_per_address_max_is_closed_at_once_and_the_others_stay(node_factory,
                                                                                             users_file):
    node = start_secured(node_factory, users_file, "--sasl-plain-on-loopback",
                         config="[node]\nconnections_per_address_max = 3\n\n")
    connections = [login(node.amqp_address, "admin") for _ in range(3)]
    try:
        with SaslSocket(node.amqp_address) as fourth:
            try:
                fourth.send(SASL_HEADER)  # an admitted socket is answered with the node's SASL header
            except (BrokenPipeError, ConnectionResetError):
                pass  # closed before the header went out
            closed, answer = fourth.closed_by_node()
            assert closed and answer == b"", answer
        for number, connection in enumerate(connections):
            sender = connection.create_sender("billing")
            assert send_outcome(sender, Message(body=number, group_id="g")) == (Delivery.ACCEPTED, None)
    finally:
        for connection in connections:
            connection.close()


def failed_plain_attempt_s(node: NodeProcess) -> float:
    """One PLAIN attempt with a wrong password: seconds from its sasl-init to its outcome."""
    with SaslSocket(node.amqp_address) as raw:
        raw.mechanisms()
        started = time.monotonic()
        raw.send(sasl_init("PLAIN", plain_response("writer", "guess")))
        assert raw.outcome()[0] == OUTCOME_AUTH
        return time.monotonic() - started


def test_from_the_fourth_failed_attempt_in_a_row_the_outcome_is_held_back_doubling(node_factory, users_file):
    node = start_secured(node_factory, users_file, "--sasl-plain-on-loopback")
    for _ in range(3):
        failed_plain_attempt_s(node)

    assert failed_plain_attempt_s(node) >= THROTTLE_DELAY_MIN_S
    assert failed_plain_attempt_s(node) >= 2 * THROTTLE_DELAY_MIN_S
    with SaslSocket(node.amqp_address) as raw:  # held back, not locked out
        assert raw.plain("writer", PASSWORD) == OUTCOME_OK


def test_refusals_from_one_address_are_logged_once_per_reason(node_factory, users_file):
    node = start_secured(node_factory, users_file, "--sasl-plain-on-loopback")
    for _ in range(3):
        with SaslSocket(node.amqp_address) as raw:
            assert raw.plain("writer", "guess") == OUTCOME_AUTH
            assert raw.closed_by_node()[0]
    output = log_after_one_more_refusal(node)

    refusals = [line for line in output if "refused:" in line]
    assert len(refusals) == 2 and "wrong password for user 'writer'" in refusals[0], refusals
    assert not [line for line in output if "dropped" in line], output


# ---- 7. rhea -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def nodejs() -> str:
    return ensure_rhea_installed()


def rhea(nodejs: str, node: NodeProcess, user: str, password: str) -> RheaClient:
    host, port = node.amqp_address.rsplit(":", 1)
    return RheaClient(nodejs, host, int(port), username=user, password=password)


def test_rhea_logs_in_with_plain_and_sends_and_receives(secured, nodejs):
    client = rhea(nodejs, secured, "admin", PASSWORD)
    try:
        assert client.connection_outcome()["event"] == "opened"
        client.open_sender("p", "rhea.plain")
        assert client.send("p", [{"body": "from rhea", "group": "g", "to": None}]) == [("accepted", None)]
        client.open_receiver("c", "rhea.plain")
        client.flow("c", 1)
        [held] = client.receive("c", 1)
        assert held.body == "from rhea"
        client.settle(held, "accept")
    finally:
        client.close()


def test_rhea_with_a_wrong_password_is_refused(node_factory, users_file, nodejs):
    node = start_secured(node_factory, users_file, "--sasl-plain-on-loopback")
    client = rhea(nodejs, node, "admin", "not the password")
    try:
        outcome = client.connection_outcome()
        assert outcome["event"] == "error" and outcome["condition"] == UNAUTHORIZED, outcome
    finally:
        client.close()
