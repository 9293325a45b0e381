"""Who calls the admin API and the HTTP port, in one process: the Basic header, the verification
cache, identities, the permission table, the error table, the CLI's credential flags, and the admin
API and /metrics served with a users database built in memory."""

from __future__ import annotations

import base64
import io
import json
import ssl
import urllib.error
import urllib.request
from types import SimpleNamespace

import grpc
import pytest

from node import certs, cli, config
from node.admin import arguments, commands
from node.admin.client import AccessDenied, AdminClient
from node.admin.callers import (ANONYMOUS, AUTHORIZATION_KEY, EVERY_QUEUE, FAILURES_BEFORE_THROTTLE,
                                    HEADER_LENGTH_MAX_CHARS, THROTTLE_DELAY_MIN_MS,
                                    Authenticator, Caller, Unauthenticated, VerifiedCache, authorization_of,
                                    basic_metadata, basic_value, check_manage, may_see, parse_basic)
from node.admin.service import QUEUES_MANAGED, serve, status_for
from node.core.access.roles import Grant
from node.core.dispatch.broker import Broker
from node.core.errors import InvalidConfig, Unauthorized
from node.core.dispatch.message import Message
from node.core.dispatch.settings import QueueSettings
from node.http_port.server import CHALLENGE, HealthServer
from node.users import UserDatabase
from proto import admin_pb2
from tests.unit.test_admin import BrokerControl

PASSWORD = "correct horse battery"
ITERATIONS = 4096


def database() -> UserDatabase:
    users = UserDatabase()
    users.set_role("orders-manager", [Grant(frozenset({"manage"}), ("orders.*",))])
    users.set_role("payments-browser", [Grant(frozenset({"browse"}), ("payments",))])
    users.set_role("sender", [Grant(frozenset({"send"}), ("#",))])
    for name, role in (("admin", "administrator"), ("manager", "orders-manager"),
                       ("viewer", "payments-browser"), ("sender", "sender")):
        users.add_user(name, PASSWORD, [role], iterations=ITERATIONS)
    return users


class CountingSecurity:
    """What the admin API and /metrics read of node.security.Security; counts password checks."""

    def __init__(self, users: UserDatabase | None):
        self.database = users
        self.access = users.access() if users is not None else None
        self.checks = 0

    def verify_plain(self, user: str, password: str) -> bool:
        self.checks += 1
        return self.database is not None and self.database.verify_plain(user, password)


@pytest.fixture(scope="module")
def users() -> UserDatabase:
    return database()


# ---- the header --------------------------------------------------------------------------------

@pytest.mark.parametrize("user, password", [("alice", "s3cret"), ("zoë", "pass:with:colons"), ("a b", " x ")])
def test_basic_credentials_round_trip(user, password):
    assert parse_basic(basic_value(user, password)) == (user, password)


def test_the_basic_scheme_is_case_insensitive_as_rfc_7617_says():
    encoded = base64.b64encode(b"alice:pw").decode()
    assert parse_basic(f"basic {encoded}") == ("alice", "pw")


@pytest.mark.parametrize("value, says", [
    ("Bearer abc", "scheme 'Bearer' is not supported"),
    ("Basic !!!", "not base64"),
    ("Basic " + base64.b64encode(b"no-colon").decode(), "no 'user:password' pair"),
    ("Basic " + base64.b64encode(b":pw").decode(), "no 'user:password' pair"),
    ("Basic " + base64.b64encode(b"\xff\xfe:x").decode(), "UTF-8"),
    ("Basic " + "A" * HEADER_LENGTH_MAX_CHARS, "longer than"),
])
def test_malformed_credentials_are_refused_saying_what_is_wrong(value, says):
    with pytest.raises(Unauthenticated, match=says):
        parse_basic(value)


def test_a_user_name_with_a_colon_cannot_be_sent_and_the_flag_is_named():
    with pytest.raises(InvalidConfig, match="--user"):
        basic_value("a:b", "pw")


def test_the_authorization_value_is_found_among_other_metadata():
    assert authorization_of([("user-agent", "x"), ("authorization", "Basic eA==")]) == "Basic eA=="
    assert authorization_of([("user-agent", "x")]) is None
    with pytest.raises(Unauthenticated, match="2 authorization values"):
        authorization_of([("authorization", "a"), ("authorization", "b")])


# ---- the cache ---------------------------------------------------------------------------------

def test_a_verified_password_is_remembered_for_the_ttl_only():
    cache, users = VerifiedCache(ttl_ms=1000), object()
    cache.remember(users, "alice", "pw", now_ms=5_000)
    assert cache.verified(users, "alice", "pw", now_ms=5_999)
    assert not cache.verified(users, "alice", "pw", now_ms=6_000)
    assert not cache.verified(users, "alice", "other", now_ms=5_001)
    assert not cache.verified(users, "bob", "pw", now_ms=5_001)


def test_the_cache_holds_at_most_its_entries_and_drops_the_oldest():
    cache, users = VerifiedCache(entries_max=2), object()
    for index, user in enumerate(("a", "b", "c")):
        cache.remember(users, user, "pw", now_ms=index)
    assert len(cache) == 2
    assert not cache.verified(users, "a", "pw", now_ms=3)
    assert cache.verified(users, "b", "pw", now_ms=3) and cache.verified(users, "c", "pw", now_ms=3)


def test_a_reloaded_users_file_forgets_every_verified_password():
    cache, before, after = VerifiedCache(), object(), object()
    cache.remember(before, "alice", "pw", now_ms=0)
    assert not cache.verified(after, "alice", "pw", now_ms=1)
    cache.remember(after, "bob", "pw", now_ms=1)
    assert not cache.verified(after, "alice", "pw", now_ms=2) and len(cache) == 1


def test_the_cache_keeps_no_password():
    cache = VerifiedCache(key=b"k" * 32)
    cache.remember(object(), "alice", "hunter2", now_ms=0)
    assert all(b"hunter2" not in digest for digest in cache._verified_until_ms)


# ---- identities --------------------------------------------------------------------------------

def test_an_open_node_takes_everyone_as_anonymous_and_checks_nothing():
    security = CountingSecurity(None)
    authenticator = Authenticator(security)
    assert authenticator.identify(None, None, now_ms=0).user == ANONYMOUS
    assert authenticator.identify(basic_value("x", "y"), "cert-user", now_ms=0).user == ANONYMOUS
    assert security.checks == 0


def test_a_secured_node_refuses_a_call_without_credentials_saying_what_to_give(users):
    with pytest.raises(Unauthenticated, match="--user NAME and a password .* --cert and --key"):
        Authenticator(CountingSecurity(users)).identify(None, None, now_ms=0)


def test_a_wrong_password_and_an_unknown_user_get_the_same_answer(users):
    authenticator = Authenticator(CountingSecurity(users))
    for user, password in (("admin", "wrong"), ("nobody", PASSWORD)):
        with pytest.raises(Unauthenticated, match=f"user '{user}': unknown user or wrong password"):
            authenticator.identify(basic_value(user, password), None, now_ms=0)


def test_several_calls_of_one_command_pay_one_password_check_and_failures_are_not_remembered(users):
    security = CountingSecurity(users)
    authenticator = Authenticator(security)
    for now_ms in (0, 10, 20):
        assert authenticator.identify(basic_value("admin", PASSWORD), None, now_ms).user == "admin"
    assert security.checks == 1
    authenticator.identify(basic_value("admin", PASSWORD), None, now_ms=60_000)  # past the TTL: checked again
    assert security.checks == 2
    for _ in range(2):
        with pytest.raises(Unauthenticated):
            authenticator.identify(basic_value("admin", "wrong"), None, now_ms=60_001)
    assert security.checks == 4


def test_failed_logins_from_one_address_are_refused_unchecked_while_it_is_held(users):
    security = CountingSecurity(users)
    authenticator = Authenticator(security)
    authenticator.identify(basic_value("admin", PASSWORD), None, 0, "10.0.0.1")  # checked, then remembered
    for now_ms in range(1, FAILURES_BEFORE_THROTTLE + 2):
        with pytest.raises(Unauthenticated, match="wrong password"):
            authenticator.identify(basic_value("admin", "guess"), None, now_ms, "10.0.0.1")
    checks = security.checks
    last_failure_ms = FAILURES_BEFORE_THROTTLE + 1
    # held: refused unchecked, and each refusal counts, holding the address twice as long from then
    for attempt, password in enumerate(("guess", PASSWORD, "another guess")):
        now_ms = last_failure_ms + THROTTLE_DELAY_MIN_MS - 1
        with pytest.raises(Unauthenticated, match=r"too many failed logins in a row from 10\.0\.0\.1: .* another "
                                                  rf"{THROTTLE_DELAY_MIN_MS << (attempt + 1)} ms"):
            authenticator.identify(basic_value("viewer", password), None, now_ms, "10.0.0.1")
        last_failure_ms = now_ms
    assert security.checks == checks  # no derivation spent on a held address
    # other addresses and sourceless calls are not held
    assert authenticator.identify(basic_value("viewer", PASSWORD), None, last_failure_ms, "10.0.0.2").user == "viewer"
    assert authenticator.identify(basic_value("manager", PASSWORD), None, last_failure_ms).user == "manager"
    # once a whole delay passed without attempts, the next one is checked again
    now_ms = last_failure_ms + (THROTTLE_DELAY_MIN_MS << 3)
    assert authenticator.identify(basic_value("sender", PASSWORD), None, now_ms, "10.0.0.1").user == "sender"
    # that success does not end the address's streak: the next failure holds it again
    with pytest.raises(Unauthenticated, match="wrong password"):
        authenticator.identify(basic_value("viewer", "guess"), None, now_ms + 1, "10.0.0.1")
    with pytest.raises(Unauthenticated, match=r"too many failed logins in a row from 10\.0\.0\.1"):
        authenticator.identify(basic_value("manager", "a guess"), None, now_ms + 2, "10.0.0.1")


def test_successes_of_ones_own_account_do_not_reset_the_throttle_on_guesses_at_another(users):
    # issue 26 finding 5: with one low-privilege account, 30 guesses on the admin port went unthrottled
    security = CountingSecurity(users)
    authenticator = Authenticator(security)
    refusals = 0
    for now_ms in range(30):
        assert authenticator.identify(basic_value("viewer", PASSWORD), None, now_ms, "10.0.0.9").user == "viewer"
        try:
            authenticator.identify(basic_value("admin", f"guess {now_ms}"), None, now_ms, "10.0.0.9")
        except Unauthenticated as error:
            refusals += "too many failed logins" in str(error)
    assert security.checks == 1 + FAILURES_BEFORE_THROTTLE + 1  # viewer once (then remembered), 4 guesses
    assert refusals == 30 - FAILURES_BEFORE_THROTTLE - 1


def test_guesses_at_one_user_from_many_addresses_hold_that_user_but_not_a_client_that_logged_in_before(users):
    security = CountingSecurity(users)
    authenticator = Authenticator(security, VerifiedCache(ttl_ms=1))  # remembers nothing past 1 ms
    assert authenticator.identify(basic_value("admin", PASSWORD), None, 0, "10.0.0.1").user == "admin"
    for number in range(FAILURES_BEFORE_THROTTLE + 1):
        with pytest.raises(Unauthenticated, match="wrong password"):
            authenticator.identify(basic_value("admin", "guess"), None, 10, f"10.1.0.{number}")
    with pytest.raises(Unauthenticated, match="too many failed logins in a row for user 'admin'"):
        authenticator.identify(basic_value("admin", PASSWORD), None, 11, "10.2.0.1")
    assert authenticator.identify(basic_value("admin", PASSWORD), None, 11, "10.0.0.1").user == "admin"


def test_a_password_verified_before_still_works_from_a_held_address(users):
    authenticator = Authenticator(CountingSecurity(users))
    authenticator.identify(basic_value("admin", PASSWORD), None, 0, "10.0.0.1")
    for now_ms in range(1, FAILURES_BEFORE_THROTTLE + 3):
        with pytest.raises(Unauthenticated):
            authenticator.identify(basic_value("admin", "guess"), None, now_ms, "10.0.0.1")
    assert authenticator.identify(basic_value("admin", PASSWORD), None, 10, "10.0.0.1").user == "admin"


def test_a_certificate_names_the_user_unless_credentials_are_given(users):
    authenticator = Authenticator(CountingSecurity(users))
    by_certificate = authenticator.identify(None, "manager", now_ms=0)
    assert by_certificate == Caller("manager", by_certificate=True)
    assert authenticator.identify(basic_value("admin", PASSWORD), "manager", now_ms=0).user == "admin"


def test_a_certificate_cannot_claim_the_anonymous_roles(users):
    with pytest.raises(Unauthenticated, match="identifies nobody"):
        Authenticator(CountingSecurity(users)).identify(None, ANONYMOUS, now_ms=0)


def test_a_password_callers_credentials_are_passed_on_to_the_other_members(users):
    value = basic_value("admin", PASSWORD)
    caller = Authenticator(CountingSecurity(users)).identify(value, None, now_ms=0)
    assert caller.forwarded == ((AUTHORIZATION_KEY, value),)


# ---- decisions ---------------------------------------------------------------------------------

def test_every_admin_method_says_which_queues_it_needs_manage_on():
    methods = {method.name for method in admin_pb2.DESCRIPTOR.services_by_name["AdminService"].methods}
    assert set(QUEUES_MANAGED) == methods


def test_cluster_wide_methods_need_manage_on_every_queue(users):
    access = users.access()
    check_manage(access, Caller("admin"), [EVERY_QUEUE])
    with pytest.raises(Unauthorized, match=r"cluster status and membership .* manage on every queue.*manage:#"):
        check_manage(access, Caller("manager"), QUEUES_MANAGED["ClusterStatus"](admin_pb2.ClusterStatusRequest()))


def test_a_move_needs_manage_on_both_queues(users):
    request = admin_pb2.MoveGroupRequest(queue="orders.x", group="g", destination_queue="payments")
    with pytest.raises(Unauthorized, match="user 'manager' may not manage queue 'payments'"):
        check_manage(users.access(), Caller("manager"), QUEUES_MANAGED["MoveGroup"](request))


def test_a_listing_shows_the_queues_a_user_may_manage_or_browse(users):
    access = users.access()
    names = ("orders.x", "payments", "other")
    assert [q for q in names if may_see(access, Caller("manager"), q)] == ["orders.x"]
    assert [q for q in names if may_see(access, Caller("viewer"), q)] == ["payments"]
    assert [q for q in names if may_see(access, Caller("sender"), q)] == []
    assert [q for q in names if may_see(access, Caller("admin"), q)] == list(names)


@pytest.mark.parametrize("error, status", [
    (Unauthenticated("no credentials"), grpc.StatusCode.UNAUTHENTICATED),
    (Unauthorized("no manage"), grpc.StatusCode.PERMISSION_DENIED),
])
def test_refusals_have_their_own_status_codes(error, status):
    assert status_for(error) is status


# ---- the admin API with a users database --------------------------------------------------------

@pytest.fixture
def secured_api(users):
    broker = Broker()
    for name in ("orders.x", "orders.y", "payments"):
        broker.declare_queue(QueueSettings(name=name))
        broker.enqueue(name, Message(b"payload", "g"), now_ms=1_000)
    server, port = serve(BrokerControl(broker, now_ms=lambda: 1_000), "127.0.0.1", 0,
                         security=CountingSecurity(users))
    yield SimpleNamespace(address=f"127.0.0.1:{port}", broker=broker)
    server.stop(None)


def client_as(api, user: str | None, password: str = PASSWORD) -> AdminClient:
    return AdminClient(api.address, 5000, metadata=basic_metadata(user, password) if user else ())


def test_without_credentials_the_api_answers_unauthenticated(secured_api):
    with client_as(secured_api, None) as client, pytest.raises(AccessDenied) as refused:
        client.list_queues()
    assert refused.value.status == "UNAUTHENTICATED" and "--user" in refused.value.message


def test_a_user_lacking_manage_is_denied_and_told_how_to_get_it(secured_api):
    with client_as(secured_api, "manager") as client:
        assert client.purge_group("orders.x", "g", None) == 1
        with pytest.raises(AccessDenied) as refused:
            client.purge_group("payments", "g", None)
    assert refused.value.status == "PERMISSION_DENIED"
    assert "user 'manager' may not manage queue 'payments'" in refused.value.message
    assert "grouper role set ROLE --allow manage:payments" in refused.value.message


def test_authorization_comes_before_existence_so_names_do_not_leak(secured_api):
    with client_as(secured_api, "manager") as client, pytest.raises(AccessDenied):
        client.delete_queue("payments.unknown")


def test_the_queue_list_holds_only_what_the_caller_may_see(secured_api):
    def listed(user):
        with client_as(secured_api, user) as client:
            return [row["name"] for row in client.list_queues()]
    assert listed("admin") == ["orders.x", "orders.y", "payments"]
    assert listed("manager") == ["orders.x", "orders.y"]
    assert listed("viewer") == ["payments"]
    assert listed("sender") == []


def grouper(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def no_credentials_in_environment(monkeypatch):
    for name in (arguments.USER_ENV, arguments.PASSWORD_ENV, arguments.CA_ENV, arguments.CERT_ENV, arguments.KEY_ENV):
        monkeypatch.delenv(name, raising=False)


def test_the_cli_exits_4_without_credentials_and_with_a_denied_user(secured_api, capsys, monkeypatch,
                                                                    no_credentials_in_environment):
    code, _, err = grouper(capsys, "queue", "list", "--node", secured_api.address)
    assert code == commands.EXIT_DENIED == 4
    assert "did not accept the credentials (UNAUTHENTICATED)" in err and "--user NAME" in err
    monkeypatch.setattr("sys.stdin", io.StringIO(PASSWORD + "\n"))
    code, _, err = grouper(capsys, "group", "purge", "payments", "g", "--node", secured_api.address,
                           "--user", "manager", "--password-stdin")
    assert code == 4 and "refused (PERMISSION_DENIED): user 'manager' may not manage queue 'payments'" in err


def test_the_cli_takes_user_and_password_from_the_environment(secured_api, capsys, monkeypatch,
                                                              no_credentials_in_environment):
    monkeypatch.setenv(arguments.USER_ENV, "manager")
    monkeypatch.setenv(arguments.PASSWORD_ENV, PASSWORD)
    code, out, _ = grouper(capsys, "queue", "list", "--json", "--node", secured_api.address)
    assert code == 0 and [row["name"] for row in json.loads(out)] == ["orders.x", "orders.y"]


def test_the_cli_asks_for_the_password_on_a_terminal(secured_api, capsys, monkeypatch,
                                                     no_credentials_in_environment):
    class Terminal(io.StringIO):
        def isatty(self):
            return True
    prompts = []
    monkeypatch.setattr("sys.stdin", Terminal())
    monkeypatch.setattr("getpass.getpass", lambda prompt: prompts.append(prompt) or PASSWORD)
    code, _, _ = grouper(capsys, "queue", "list", "--node", secured_api.address, "--user", "admin")
    assert code == 0 and prompts == [f"password for admin at {secured_api.address}: "]


@pytest.mark.parametrize("argv, environment, names", [
    (["--user", "admin"], {}, "--password-stdin"),  # no terminal, no password given
    (["--password-stdin"], {}, "--user"),
    (["--user", "admin"], {arguments.PASSWORD_ENV: ""}, arguments.PASSWORD_ENV),
    (["--cert", "c.pem"], {}, "--key"),
    (["--ca", "/no/such/ca.pem"], {}, "--ca: cannot read /no/such/ca.pem"),
    ([], {arguments.CA_ENV: "/no/such/ca.pem"}, f"{arguments.CA_ENV}: cannot read"),
    (["--user", "a:b"], {arguments.PASSWORD_ENV: "x"}, "--user"),
])
def test_bad_credential_flags_exit_2_naming_the_flag(argv, environment, names, capsys, monkeypatch,
                                                     no_credentials_in_environment):
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    for key, value in environment.items():
        monkeypatch.setenv(key, value)
    code, _, err = grouper(capsys, "queue", "list", "--node", "127.0.0.1:1", *argv)
    assert code == 2 and names in err


def test_a_password_is_never_sent_unencrypted_off_this_host(capsys, monkeypatch, no_credentials_in_environment):
    monkeypatch.setenv(arguments.PASSWORD_ENV, PASSWORD)
    code, _, err = grouper(capsys, "queue", "list", "--node", "192.0.2.1:5673", "--user", "admin")
    assert code == 2 and "unencrypted" in err and "--ca" in err


# ---- settings ----------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, key", [
    ({"admin_tls_cert_file": "c.pem"}, "admin_tls_key_file"),
    ({"admin_tls_key_file": "k.pem"}, "admin_tls_cert_file"),
    ({"admin_tls_ca_file": "ca.pem"}, "admin_tls_ca_file"),
    ({"http_tls_cert_file": "c.pem"}, "http_tls_key_file"),
    ({"metrics_auth": "digest"}, "metrics_auth"),
    ({"admin_tls_cert_file": "c.pem", "admin_tls_key_file": "k.pem", "peers": "127.0.0.1:5674,127.0.0.1:6674",
      "raft_port": 5674}, "admin_tls_cert_file"),
])
def test_bad_admin_and_http_security_settings_are_named(overrides, key):
    with pytest.raises(InvalidConfig) as refused:
        config.load(environ={}, overrides=overrides)
    assert refused.value.key == key


def test_admin_tls_in_a_cluster_needs_cluster_tls_for_the_forwarding():
    cluster = {"peers": "127.0.0.1:5674,127.0.0.1:6674", "raft_port": 5674, "admin_tls_cert_file": "c.pem",
               "admin_tls_key_file": "k.pem"}
    with pytest.raises(InvalidConfig, match="admin TLS needs cluster TLS"):
        config.load(environ={}, overrides=cluster)
    config.load(environ={}, overrides={**cluster, "cluster_tls_cert_file": "n.pem", "cluster_tls_key_file": "n-key.pem",
                                       "cluster_tls_ca_file": "ca.pem"})


def test_admin_and_http_security_are_off_by_default():
    loaded = config.load(environ={})
    assert (loaded.admin_tls_cert_file, loaded.http_tls_cert_file, loaded.metrics_auth) == ("", "", "open")


# ---- /metrics ------------------------------------------------------------------------------------

class Probe:
    def readiness(self):
        return True, ""

    def metrics_snapshot(self):
        return {"ready": True, "queues": [], "consumers": [], "journal": None, "cluster": None,
                "engine": {"connections": 0, "links": 0, "unsettled_deliveries": 0}, "resident_bytes": None}


@pytest.fixture
def basic_metrics(users):
    server = HealthServer(Probe(), "127.0.0.1", 0, security=CountingSecurity(users), metrics_auth="basic")
    yield server
    server._httpd.server_close()


@pytest.mark.parametrize("authorization, status", [
    (None, 401),
    (basic_value("admin", "wrong"), 401),
    ("Bearer x", 401),
    (basic_value("manager", PASSWORD), 403),
    (basic_value("admin", PASSWORD), 200),
])
def test_basic_metrics_need_a_user_with_manage_on_every_queue(basic_metrics, authorization, status):
    answer, _, body, headers = basic_metrics.answer("/metrics", authorization)
    assert answer == status, body
    assert (headers.get("WWW-Authenticate") == CHALLENGE) == (status == 401)
    if status == 403:
        assert b"manage:#" in body


def test_health_and_readiness_stay_open_with_basic_metrics(basic_metrics):
    assert basic_metrics.answer("/healthz")[0] == 200 and basic_metrics.answer("/readyz")[0] == 200


def test_basic_metrics_without_a_users_file_refuse_to_start():
    with pytest.raises(InvalidConfig, match="metrics_auth: basic needs a users file"):
        HealthServer(Probe(), "127.0.0.1", 0, security=CountingSecurity(None), metrics_auth="basic")


def test_https_serves_metrics_and_health(tmp_path):
    certs.make_ca(tmp_path)
    cert_file, key_file = certs.make_leaf(tmp_path, "localhost", ips=("127.0.0.1",))
    server = HealthServer(Probe(), "127.0.0.1", 0, tls_cert_file=str(cert_file), tls_key_file=str(key_file))
    server.start()
    try:
        context = ssl.create_default_context(cafile=str(tmp_path / certs.CA_CERT_FILE))
        for path in ("/healthz", "/metrics"):
            with urllib.request.urlopen(f"https://127.0.0.1:{server.port}{path}", context=context, timeout=10) as reply:
                assert reply.status == 200
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=10)
    finally:
        server.stop()
