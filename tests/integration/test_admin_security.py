"""The admin API, the management CLI and the HTTP port of a real secured node, black box: who may
call which admin method on which queue, what a caller without (or with wrong) credentials is told,
admin TLS with the development CA, a client certificate as the identity, and /metrics open or
behind HTTP basic auth while /healthz and /readyz stay open.

Rules of this file:
- Users and roles are made once per module with the CLI (`grouper role set`, `grouper user add
  --password-stdin`); a test that edits them gets its own copy of the users file.
- The module's shared node (`secured`) serves the authorization matrix through `AdminClient`
  (one process, many calls) and a few CLI runs; TLS and metrics tests start nodes of their own.
- Every wait is bounded; nothing asserts an upper bound on time.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from proton.utils import BlockingConnection

from node import certs
from node.admin.client import AccessDenied, AdminClient, NodeFailure
from node.admin.callers import basic_metadata
from node.admin.tls import channel_credentials
from node.core.dispatch.settings import QueueSettings
from proto import admin_pb2, admin_pb2_grpc
from tests.integration.cli import grouper, grouper_ok, write_users_file
from tests.integration.cluster import Cluster
from tests.integration.harness import WAIT_S, NodeProcess, grouped

PASSWORD = "correct horse battery"
ROLES = {"orders-manager": "manage:orders.*", "sender": "send:orders.#", "payments-browser": "browse:payments"}
USERS = {"admin": "administrator", "manager": "orders-manager", "sender": "sender", "viewer": "payments-browser"}
QUEUES = ("orders.x", "orders.y", "payments")
QUEUES_CONFIG = "".join(f'[[queue]]\nname = "{name}"\n\n' for name in QUEUES)
RELOAD_WAIT_S = 20.0  # the node reads a changed users file within about a second
RETRY_INTERVAL_S = 0.2


# ---- the CLI, users and certificates -----------------------------------------------------------

def as_user(node: NodeProcess, user: str, *args: str, password: str = PASSWORD) -> subprocess.CompletedProcess:
    """`grouper ARGS` as `user`, with the CA of the environment if it gives one (a node with admin TLS)."""
    tls = ("--ca", os.environ["GROUPER_CA"]) if os.environ.get("GROUPER_CA") else ()
    return grouper(*args, "--node", node.admin_address, "--user", user, "--password-stdin", *tls,
                   stdin=password + "\n")


@pytest.fixture(scope="module")
def users_file(tmp_path_factory) -> Path:
    return write_users_file(tmp_path_factory.mktemp("users") / "users.json", ROLES, USERS, PASSWORD)


@pytest.fixture(scope="module")
def ca(tmp_path_factory) -> Path:
    """The development CA: the node's certificate (localhost, 127.0.0.1) and client certificates."""
    directory = tmp_path_factory.mktemp("ca")
    certs.make_ca(directory)
    certs.make_leaf(directory, "localhost", ips=("127.0.0.1",))
    for user in ("manager", "stranger"):
        certs.make_leaf(directory, user, client_only=True)
    return directory


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("other-ca")
    certs.make_ca(directory)
    certs.make_leaf(directory, "manager", client_only=True)
    return directory


def ca_file(directory: Path) -> str:
    return str(directory / certs.CA_CERT_FILE)


def pair(directory: Path, name: str) -> tuple[str, str]:
    return tuple(str(path) for path in certs.leaf_paths(directory, name))


# ---- nodes -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def secured(tmp_path_factory, users_file):
    """The module's node: the users file, PLAIN on loopback (to send test messages), the QUEUES."""
    node = NodeProcess(tmp_path_factory.mktemp("secured") / "node", QUEUES_CONFIG,
                       ("--users-file", str(users_file), "--sasl-plain-on-loopback"))
    try:
        yield node.start()
    finally:
        node.kill()


def start_secured(node_factory, users_file: Path, *args: str) -> NodeProcess:
    return node_factory(QUEUES_CONFIG, "--users-file", str(users_file), *args)


def start_admin_tls(node_factory, users_file: Path, ca: Path, *, client_certificates: bool) -> NodeProcess:
    cert_file, key_file = pair(ca, "localhost")
    args = ["--admin-tls-cert-file", cert_file, "--admin-tls-key-file", key_file]
    if client_certificates:
        args += ["--admin-tls-ca-file", ca_file(ca)]
    return start_secured(node_factory, users_file, *args)


def client(node: NodeProcess, user: str | None, password: str = PASSWORD, **options) -> AdminClient:
    return AdminClient(node.admin_address, 10_000, metadata=basic_metadata(user, password) if user else (),
                       **options)


def send(node: NodeProcess, queue: str, group: str, count: int) -> None:
    """As admin, over SASL PLAIN on loopback."""
    connection = BlockingConnection(node.url, timeout=WAIT_S, user="admin", password=PASSWORD,
                                    allowed_mechs="PLAIN", allow_insecure_mechs=True)
    try:
        sender = connection.create_sender(queue)
        for index in range(count):
            sender.send(grouped(f"{group}-{index}", group))
    finally:
        connection.close()


def depth(node: NodeProcess, queue: str) -> int:
    with client(node, "admin") as admin:
        return next(row["depth_messages"] for row in admin.list_queues() if row["name"] == queue)


# ---- the authorization matrix ------------------------------------------------------------------

ALLOWED, DENIED = "allowed", "denied"


def _added_and_deleted(admin_client: AdminClient, name: str) -> None:
    admin_client.add_queue(QueueSettings(name=name))
    admin_client.delete_queue(name)


# name: (call, the users allowed); every other user is denied with PERMISSION_DENIED
OPERATIONS = {
    "add and delete orders.new": (lambda c, u: _added_and_deleted(c, f"orders.new-{u}"), {"admin", "manager"}),
    "add and delete payments.new": (lambda c, u: _added_and_deleted(c, f"payments.new-{u}"), {"admin"}),
    "delete unknown payments.gone": (lambda c, u: c.delete_queue("payments.gone"), {"admin"}),
    "list groups of orders.x": (lambda c, u: c.list_groups("orders.x"), {"admin", "manager"}),
    "list groups of payments": (lambda c, u: c.list_groups("payments"), {"admin"}),
    "reset groups of orders.x": (lambda c, u: c.reset_groups("orders.x", None), {"admin", "manager"}),
    "reset groups of payments": (lambda c, u: c.reset_groups("payments", None), {"admin"}),
    "purge orders.x": (lambda c, u: c.purge_group("orders.x", "absent", None), {"admin", "manager"}),
    "purge payments": (lambda c, u: c.purge_group("payments", "absent", None), {"admin"}),
    "move orders.x to orders.y": (lambda c, u: c.move_group("orders.x", "absent", "orders.y", None),
                                  {"admin", "manager"}),
    "move orders.x to payments": (lambda c, u: c.move_group("orders.x", "absent", "payments", None), {"admin"}),
    # a reroute sends to its destination: manage on both queues is not enough without send there
    "reroute orders.x to orders.y": (lambda c, u: c.reroute_queue("orders.x", "orders.y", "absent"), {"admin"}),
    "reroute orders.x to payments": (lambda c, u: c.reroute_queue("orders.x", "payments", "absent"), {"admin"}),
    "cluster status": (lambda c, u: c.cluster_status(), {"admin"}),
    "add member": (lambda c, u: c.add_member("127.0.0.1:1"), {"admin"}),
    "remove member": (lambda c, u: c.remove_member("127.0.0.1:1"), {"admin"}),
}


@pytest.mark.parametrize("user", sorted(USERS))
@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_authorization_matrix(secured, user, operation):
    call, allowed_users = OPERATIONS[operation]
    with client(secured, user) as admin_client:
        try:
            call(admin_client, user)
            outcome = ALLOWED
        except AccessDenied as error:
            assert error.status == "PERMISSION_DENIED", error.message
            assert (f"user {user!r} may not manage queue" in error.message
                    or f"user {user!r} may not send to queue" in error.message), error.message
            outcome = DENIED
        except NodeFailure as error:  # authorized, then refused for what the node is: absent group, no cluster
            assert error.status in ("NOT_FOUND", "FAILED_PRECONDITION"), (error.status, error.message)
            outcome = ALLOWED
    assert outcome == (ALLOWED if user in allowed_users else DENIED)


def test_each_user_lists_the_queues_it_may_manage_or_browse(secured):
    def listed(user):
        with client(secured, user) as admin_client:
            return sorted(row["name"] for row in admin_client.list_queues() if row["name"] in QUEUES)
    assert listed("admin") == sorted(QUEUES)
    assert listed("manager") == ["orders.x", "orders.y"]
    assert listed("viewer") == ["payments"]
    assert listed("sender") == []


def test_an_orders_manager_purges_orders_but_not_payments(secured):
    send(secured, "orders.x", "purge-me", 3)
    send(secured, "payments", "purge-me", 2)
    payments_before = depth(secured, "payments")

    purged = as_user(secured, "manager", "group", "purge", "orders.x", "purge-me")
    assert purged.returncode == 0, purged.stderr
    assert purged.stdout.strip() == "purged 3 messages from group purge-me of queue orders.x"

    refused = as_user(secured, "manager", "group", "purge", "payments", "purge-me")
    assert refused.returncode == 4
    assert "refused (PERMISSION_DENIED): user 'manager' may not manage queue 'payments'" in refused.stderr
    assert "grouper role set ROLE --allow manage:payments" in refused.stderr
    assert depth(secured, "payments") == payments_before


def test_a_sender_is_refused_every_management_command(secured):
    for argv in (("queue", "add", "orders.z"), ("queue", "delete", "orders.x"), ("groups", "orders.x"),
                 ("group", "reset", "orders.x"), ("group", "purge", "orders.x", "g"),
                 ("group", "move", "orders.x", "g", "orders.y"), ("cluster", "status")):
        result = as_user(secured, "sender", *argv)
        assert result.returncode == 4, (argv, result.stderr)
        assert "PERMISSION_DENIED" in result.stderr and "user 'sender' may not manage" in result.stderr
    assert "orders.z" not in grouper_ok("queue", "list", "--node", secured.admin_address, "--user", "admin",
                                        "--password-stdin", stdin=PASSWORD + "\n")


# ---- who is calling ----------------------------------------------------------------------------

def test_a_call_without_credentials_is_unauthenticated_and_the_cli_says_what_to_give(secured):
    with grpc.insecure_channel(secured.admin_address) as channel, pytest.raises(grpc.RpcError) as raised:
        admin_pb2_grpc.AdminServiceStub(channel).ListQueues(admin_pb2.ListQueuesRequest(), timeout=WAIT_S)
    assert raised.value.code() is grpc.StatusCode.UNAUTHENTICATED

    result = grouper("queue", "list", "--node", secured.admin_address)
    assert result.returncode == 4 and result.stdout == ""
    assert "did not accept the credentials (UNAUTHENTICATED)" in result.stderr
    assert "--user NAME" in result.stderr and "--cert and --key" in result.stderr


def test_a_wrong_password_and_an_unknown_user_are_refused_alike(secured):
    for user, password in (("admin", "not the password"), ("nobody", PASSWORD)):
        result = as_user(secured, user, "queue", "list", password=password)
        assert result.returncode == 4
        assert f"user '{user}': unknown user or wrong password" in result.stderr


def test_user_and_password_come_from_the_environment(secured):
    result = grouper("queue", "list", "--node", secured.admin_address,
                     env={"GROUPER_USER": "manager", "GROUPER_PASSWORD": PASSWORD})
    assert result.returncode == 0, result.stderr
    assert "orders.x" in result.stdout and "payments" not in result.stdout


def test_a_changed_password_is_refused_once_the_node_reloads_the_file(node_factory, tmp_path, users_file):
    own = Path(shutil.copy(users_file, tmp_path / "own-users.json"))
    node = start_secured(node_factory, own)
    assert as_user(node, "admin", "queue", "list").returncode == 0  # verified, and remembered by the node
    grouper_ok("user", "passwd", "admin", "--password-stdin", "--users-file", str(own), stdin="new password\n")
    deadline = time.monotonic() + RELOAD_WAIT_S
    while as_user(node, "admin", "queue", "list").returncode != 4:
        assert time.monotonic() < deadline, f"the old password still works {RELOAD_WAIT_S} s after the change"
        time.sleep(RETRY_INTERVAL_S)
    assert as_user(node, "admin", "queue", "list", password="new password").returncode == 0


def test_an_open_loopback_node_needs_no_credentials_and_ignores_them(node_factory):
    node = node_factory(QUEUES_CONFIG)
    assert grouper("queue", "list", "--node", node.admin_address).returncode == 0
    assert as_user(node, "whoever", "queue", "list", password="anything").returncode == 0


# ---- admin TLS -----------------------------------------------------------------------------------

def test_admin_tls_with_the_dev_ca_takes_a_password(node_factory, users_file, ca):
    node = start_admin_tls(node_factory, users_file, ca, client_certificates=False)
    listed = grouper("queue", "list", "--node", node.admin_address, "--ca", ca_file(ca), "--user", "manager",
                     "--password-stdin", stdin=PASSWORD + "\n")
    assert listed.returncode == 0, listed.stderr
    assert "orders.x" in listed.stdout

    unauthenticated = grouper("queue", "list", "--node", node.admin_address, "--ca", ca_file(ca))
    assert unauthenticated.returncode == 4 and "UNAUTHENTICATED" in unauthenticated.stderr

    plaintext = grouper("queue", "list", "--node", node.admin_address)
    assert plaintext.returncode == 3 and "give --ca PEM" in plaintext.stderr

    from_environment = grouper("queue", "list", "--node", node.admin_address,
                               env={"GROUPER_CA": ca_file(ca), "GROUPER_USER": "admin", "GROUPER_PASSWORD": PASSWORD})
    assert from_environment.returncode == 0, from_environment.stderr


def test_a_client_certificate_names_the_user(node_factory, users_file, ca):
    node = start_admin_tls(node_factory, users_file, ca, client_certificates=True)
    cert_file, key_file = pair(ca, "manager")
    tls = ("--ca", ca_file(ca), "--cert", cert_file, "--key", key_file)
    send_to = ("--node", node.admin_address, *tls)

    allowed = grouper("group", "reset", "orders.x", *send_to)
    assert allowed.returncode == 0, allowed.stderr
    denied = grouper("group", "reset", "payments", *send_to)
    assert denied.returncode == 4 and "user 'manager' may not manage queue 'payments'" in denied.stderr

    # credentials given win over the certificate
    as_admin = grouper("group", "reset", "payments", *send_to, "--user", "admin", "--password-stdin",
                       stdin=PASSWORD + "\n")
    assert as_admin.returncode == 0, as_admin.stderr

    # a certificate whose CN is no user of the file is identified, then refused
    stranger_cert, stranger_key = pair(ca, "stranger")
    stranger = grouper("group", "reset", "orders.x", "--node", node.admin_address, "--ca", ca_file(ca),
                       "--cert", stranger_cert, "--key", stranger_key)
    assert stranger.returncode == 4 and "there is no user 'stranger'" in stranger.stderr


def test_client_certificates_required_refuse_clients_without_one_or_from_another_ca(node_factory, users_file, ca,
                                                                                      other_ca):
    node = start_admin_tls(node_factory, users_file, ca, client_certificates=True)
    without = grouper("queue", "list", "--node", node.admin_address, "--ca", ca_file(ca), "--user", "admin",
                      "--password-stdin", stdin=PASSWORD + "\n")
    assert without.returncode == 3 and "--cert/--key" in without.stderr
    foreign_cert, foreign_key = pair(other_ca, "manager")
    foreign = grouper("queue", "list", "--node", node.admin_address, "--ca", ca_file(ca), "--cert", foreign_cert,
                      "--key", foreign_key)
    assert foreign.returncode == 3
    with AdminClient(node.admin_address, 10_000, credentials=channel_credentials(ca_file(ca), *pair(ca, "manager"))
                     ) as admin_client:
        assert {row["name"] for row in admin_client.list_queues()} == {"orders.x", "orders.y"}


def test_a_password_is_not_sent_in_clear_to_another_host():
    result = grouper("queue", "list", "--node", "192.0.2.1:5673", "--user", "admin", "--password-stdin",
                     stdin=PASSWORD + "\n")
    assert result.returncode == 2 and "unencrypted" in result.stderr


# ---- the HTTP port -------------------------------------------------------------------------------

def http_get(url: str, authorization: tuple[str, str] | None = None, context: ssl.SSLContext | None = None):
    """(status, headers, body) of a GET."""
    request = urllib.request.Request(url)
    if authorization is not None:
        token = base64.b64encode(f"{authorization[0]}:{authorization[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=WAIT_S, context=context) as reply:
            return reply.status, reply.headers, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.headers, error.read().decode()


def wait_ready(url: str, context: ssl.SSLContext | None = None) -> None:
    deadline = time.monotonic() + WAIT_S
    while http_get(f"{url}/readyz", context=context)[0] != 200:
        assert time.monotonic() < deadline, f"{url}/readyz not 200 within {WAIT_S} s"
        time.sleep(RETRY_INTERVAL_S)


def test_metrics_are_open_by_default_even_on_a_secured_node(secured):
    url = f"http://{secured.http_address}"
    wait_ready(url)
    status, _, body = http_get(f"{url}/metrics")
    assert status == 200 and 'grouper_queue_depth_messages{queue="payments"}' in body


def test_basic_metrics_need_a_user_with_manage_on_every_queue(node_factory, users_file):
    node = start_secured(node_factory, users_file, "--metrics-auth", "basic")
    url = f"http://{node.http_address}"
    assert http_get(f"{url}/healthz")[0] == 200
    wait_ready(url)  # /readyz answers without credentials

    status, headers, body = http_get(f"{url}/metrics")
    assert status == 401 and headers["WWW-Authenticate"].startswith('Basic realm="grouper"')
    assert "manage on '#'" in body
    status, headers, _ = http_get(f"{url}/metrics", ("admin", "wrong"))
    assert status == 401 and headers["WWW-Authenticate"].startswith('Basic realm="grouper"')
    status, _, body = http_get(f"{url}/metrics", ("manager", PASSWORD))
    assert status == 403 and "user 'manager' may not read metrics" in body
    status, _, body = http_get(f"{url}/metrics", ("admin", PASSWORD))
    assert status == 200 and "grouper_ready 1.0" in body


def test_https_serves_the_http_port_with_the_dev_ca(node_factory, users_file, ca):
    cert_file, key_file = pair(ca, "localhost")
    node = start_secured(node_factory, users_file, "--http-tls-cert-file", cert_file, "--http-tls-key-file", key_file,
                         "--metrics-auth", "basic")
    context = ssl.create_default_context(cafile=ca_file(ca))
    url = f"https://{node.http_address}"
    assert http_get(f"{url}/healthz", context=context)[0] == 200
    wait_ready(url, context)
    assert http_get(f"{url}/metrics", context=context)[0] == 401
    assert http_get(f"{url}/metrics", ("admin", PASSWORD), context=context)[0] == 200
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        urllib.request.urlopen(f"http://{node.http_address}/healthz", timeout=WAIT_S)


def test_basic_metrics_on_a_node_without_users_refuse_to_start(node_factory):
    with pytest.raises(RuntimeError, match="metrics_auth: basic needs a users file"):
        node_factory("", "--metrics-auth", "basic")


# ---- a cluster -----------------------------------------------------------------------------------

@pytest.mark.parametrize("admin_tls", [False, True], ids=["plaintext", "admin-and-cluster-tls"])
def test_in_a_cluster_the_callers_own_credentials_reach_every_member(tmp_path, users_file, ca, monkeypatch, admin_tls):
    # the harness's status polls run `grouper cluster status` with the environment's credentials
    monkeypatch.setenv("GROUPER_USER", "admin")
    monkeypatch.setenv("GROUPER_PASSWORD", PASSWORD)
    cluster = Cluster(tmp_path, size=2, config_text=QUEUES_CONFIG,
                      args=("--users-file", str(users_file), "--sasl-plain-on-loopback"))
    if admin_tls:  # forwarding moves to a peer port of its own; the admin fan-out dials the members over TLS
        monkeypatch.setenv("GROUPER_CA", ca_file(ca))
        cert_file, key_file = pair(ca, "localhost")
        for node in cluster.nodes:
            node.args += ("--cluster-tls-cert-file", cert_file, "--cluster-tls-key-file", key_file,
                          "--cluster-tls-ca-file", ca_file(ca), "--peer-port", "0",
                          "--admin-tls-cert-file", cert_file, "--admin-tls-key-file", key_file)
    try:
        cluster.start()
        status = cluster.wait_for(lambda s: all(m["queues"] and not m["error"] for m in s["members"]),
                                  "every member answering the admin's forwarded credentials")
        assert sorted(m["node"] for m in status["members"]) == sorted(cluster.node_ids)
        first, second = cluster.nodes
        send(first, "orders.x", "from-first", 2)
        send(second, "orders.x", "from-second", 3)

        listed = as_user(first, "manager", "groups", "orders.x", "--json")
        assert listed.returncode == 0, listed.stderr
        rows = {row["group"]: row for row in json.loads(listed.stdout)}
        assert {group: row["messages"] for group, row in rows.items()} == {"from-first": 2, "from-second": 3}

        purged = as_user(second, "manager", "group", "purge", "orders.x", "from-first")
        assert purged.returncode == 0 and "purged 2 messages" in purged.stdout, purged.stderr

        for argv in (("groups", "orders.x"), ("cluster", "status")):
            refused = as_user(first, "sender", *argv)
            assert refused.returncode == 4 and "PERMISSION_DENIED" in refused.stderr
        assert as_user(first, "manager", "cluster", "status").returncode == 4
    finally:
        cluster.kill_all()


# ---- throttling failed logins ------------------------------------------------------------------

FAILURES_BEFORE_THROTTLE = 3  # node/admin/callers.py


def test_failed_logins_hold_their_address_back_on_the_admin_port_and_for_metrics(node_factory, users_file):
    node = start_secured(node_factory, users_file, "--metrics-auth", "basic")
    url = f"http://{node.http_address}"
    wait_ready(url)

    def list_as(user: str, password: str) -> str:
        """'' when the call succeeds, else the node's message."""
        try:
            with client(node, user, password) as admin:
                admin.list_queues()
            return ""
        except AccessDenied as error:
            assert error.status == "UNAUTHENTICATED", error
            return error.message

    for _ in range(FAILURES_BEFORE_THROTTLE + 1):  # checked and refused; the last one starts the throttle
        assert "wrong password" in list_as("admin", "guess")
    # held: every attempt is refused unchecked and holds the address twice as long from then, so a
    # few more make the hold far longer than the calls below take
    for _ in range(4):
        said = list_as("admin", "guess")
        assert "too many failed logins in a row from 127.0.0.1" in said, said
    # the right (not yet verified) password is refused too while held, on both ports
    assert "too many failed logins in a row from 127.0.0.1" in list_as("manager", PASSWORD)
    status, headers, body = http_get(f"{url}/metrics", ("admin", PASSWORD))
    assert status == 401 and "too many failed logins" in body and headers["WWW-Authenticate"], body
    # after the hold the node announced, without attempts meanwhile, the right password works again
    held_ms = int(re.search(r"another (\d+) ms", body).group(1))
    time.sleep(held_ms / 1000)
    assert http_get(f"{url}/metrics", ("admin", PASSWORD))[0] == 200  # and ends the streak
    assert list_as("manager", PASSWORD) == ""
    assert "wrong password" in list_as("admin", "guess")  # past the hold: checked again
