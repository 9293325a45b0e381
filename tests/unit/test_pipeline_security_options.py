"""The pipeline's security options (pipeline/options.py, pipeline/security.py), without Spark or a node:
which options need which, what each file must hold, and that no password ever sits in the options."""

from __future__ import annotations

import pickle
import ssl

import pytest

from node import certs
from pipeline.amqp_client import AmqpConnection, ClientError
from pipeline.security import ANONYMOUS, EXTERNAL, PLAIN, CredentialError, Security, password, tls_context
from pipeline.options import OptionError, parse_sink, parse_source

LOCAL = {"nodes": "127.0.0.1:5671", "queue": "orders"}
REMOTE = {"nodes": "broker-0.grouper:5671,broker-1.grouper:5671", "queue": "orders"}
PASSWORD = "correct horse battery"


@pytest.fixture(scope="module")
def ca(tmp_path_factory):
    directory = tmp_path_factory.mktemp("ca")
    certs.make_ca(directory)
    certs.make_leaf(directory, "spark", client_only=True)
    return directory


@pytest.fixture
def password_file(tmp_path):
    path = tmp_path / "password"
    path.write_text(PASSWORD + "\n")
    return str(path)


def refusal(options, parse=parse_sink) -> OptionError:
    with pytest.raises(OptionError) as error:
        parse(options)
    return error.value


# ---- what the options mean ---------------------------------------------------------------------

def test_without_security_options_the_client_is_anonymous_without_tls():
    security = parse_sink(LOCAL).connect.security
    assert security == Security() and security.mechanism == ANONYMOUS and not security.tls


def test_a_user_with_a_password_file_over_tls_logs_in_with_plain(ca, password_file):
    options = {**REMOTE, "user": "spark", "passwordFile": password_file, "caFile": str(ca / "ca.pem")}

    security = parse_source(options).connect.security

    assert security.mechanism == PLAIN and security.user == "spark"
    assert security.tls, "caFile implies tls"
    assert security.password_file == password_file


def test_the_options_carry_the_passwords_path_never_the_password(ca, password_file):
    options = {**REMOTE, "user": "spark", "passwordFile": password_file, "caFile": str(ca / "ca.pem")}

    parsed = parse_sink(options)

    assert PASSWORD.encode() not in pickle.dumps(parsed)  # what Spark ships to the executors
    assert PASSWORD not in repr(parsed)


def test_a_client_certificate_logs_in_with_external(ca):
    options = {**REMOTE, "certFile": str(ca / "spark.pem"), "keyFile": str(ca / "spark-key.pem"),
               "caFile": str(ca / "ca.pem")}

    security = parse_sink(options).connect.security

    assert security.mechanism == EXTERNAL and security.tls


def test_tls_without_ca_file_trusts_the_systems_cas():
    security = parse_sink({**REMOTE, "tls": "true"}).connect.security
    assert security.tls and security.ca_file == "" and security.mechanism == ANONYMOUS
    context = tls_context(security)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname


def test_option_names_are_case_insensitive(ca, password_file):
    options = {**REMOTE, "USER": "spark", "PasswordFile": password_file, "CAFILE": str(ca / "ca.pem"), "TLS": "TRUE"}
    assert parse_sink(options).connect.security.mechanism == PLAIN


def test_a_password_from_an_environment_variable(monkeypatch, ca):
    monkeypatch.setenv("GROUPER_SPARK_PASSWORD", PASSWORD)
    options = {**REMOTE, "user": "spark", "passwordEnv": "GROUPER_SPARK_PASSWORD", "caFile": str(ca / "ca.pem")}

    security = parse_sink(options).connect.security

    assert password(security) == PASSWORD


# ---- refusals name the option -------------------------------------------------------------------

@pytest.mark.parametrize("key", ["password", "Password", "passwd"])
def test_a_literal_password_option_is_refused_with_the_alternatives(key):
    error = refusal({**LOCAL, "user": "spark", key: "secret"})
    assert error.option == key.lower()
    assert "passwordFile" in str(error) and "passwordEnv" in str(error) and "secret" not in str(error)


def test_a_user_without_a_password_is_refused():
    error = refusal({**LOCAL, "user": "spark"})
    assert error.option == "user" and "passwordFile" in str(error)


def test_a_password_without_a_user_is_refused(password_file):
    assert refusal({**LOCAL, "passwordFile": password_file}).option == "passwordfile"


def test_password_file_and_password_env_together_are_refused(password_file):
    error = refusal({**LOCAL, "user": "u", "passwordFile": password_file, "passwordEnv": "X"})
    assert error.option == "passwordenv" and "not both" in str(error)


def test_an_unreadable_password_file_is_refused_naming_its_path(tmp_path):
    missing = tmp_path / "no-such-secret"
    error = refusal({**LOCAL, "user": "spark", "passwordFile": str(missing)}, parse_source)
    assert error.option == "passwordfile" and str(missing) in str(error)


def test_an_empty_password_file_is_refused(tmp_path):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    error = refusal({**LOCAL, "user": "spark", "passwordFile": str(empty)})
    assert error.option == "passwordfile" and "empty" in str(error)


def test_a_large_file_is_not_taken_for_a_password(tmp_path):
    large = tmp_path / "large"
    large.write_bytes(b"x" * 5000)
    assert "not a password file" in str(refusal({**LOCAL, "user": "spark", "passwordFile": str(large)}))


def test_an_unset_password_variable_is_refused_naming_it(monkeypatch):
    monkeypatch.delenv("GROUPER_NO_SUCH_VARIABLE", raising=False)
    error = refusal({**LOCAL, "user": "spark", "passwordEnv": "GROUPER_NO_SUCH_VARIABLE"})
    assert error.option == "passwordenv" and "GROUPER_NO_SUCH_VARIABLE" in str(error)


def test_plain_without_tls_is_refused_for_a_node_off_this_host(password_file):
    error = refusal({**REMOTE, "user": "spark", "passwordFile": password_file})
    assert error.option == "user" and "unencrypted" in str(error) and "broker-0.grouper" in str(error)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::1]"])
def test_plain_without_tls_is_allowed_to_a_loopback_node(password_file, host):
    security = parse_sink({"nodes": f"{host}:5672", "queue": "q", "user": "spark", "passwordFile": password_file}
                          ).connect.security
    assert security.mechanism == PLAIN and not security.tls


def test_a_certificate_without_its_key_is_refused(ca):
    error = refusal({**REMOTE, "certFile": str(ca / "spark.pem")})
    assert error.option == "certfile" and "keyFile" in str(error)


def test_a_key_without_its_certificate_is_refused(ca):
    assert refusal({**REMOTE, "keyFile": str(ca / "spark-key.pem")}).option == "keyfile"


def test_tls_false_beside_a_ca_file_is_a_contradiction(ca):
    assert refusal({**REMOTE, "tls": "false", "caFile": str(ca / "ca.pem")}).option == "tls"


def test_a_ca_file_that_is_not_a_certificate_is_refused(password_file):
    error = refusal({**REMOTE, "caFile": password_file})
    assert error.option == "cafile" and password_file in str(error)


def test_a_certificate_with_the_wrong_key_is_refused(ca, tmp_path):
    certs.make_leaf(ca, "other", client_only=True)
    error = refusal({**REMOTE, "certFile": str(ca / "spark.pem"), "keyFile": str(ca / "other-key.pem")})
    assert error.option == "certfile"


def test_an_empty_security_option_is_refused():
    assert refusal({**LOCAL, "caFile": " "}).option == "cafile"


def test_tls_must_be_true_or_false():
    assert "not true or false" in str(refusal({**LOCAL, "tls": "yes"}))


# ---- the password file's content ------------------------------------------------------------------

@pytest.mark.parametrize("content, expected", [
    ("secret\n", "secret"), ("secret\r\n", "secret"), ("secret", "secret"), ("secret\n\n", "secret\n"),
    (" spaced secret \n", " spaced secret "),
])
def test_one_trailing_newline_is_dropped_from_a_password_file(tmp_path, content, expected):
    path = tmp_path / "password"
    path.write_text(content, newline="")
    assert password(Security(user="u", password_file=str(path))) == expected


def test_a_password_file_gone_by_the_time_a_task_runs_fails_in_the_client_naming_the_option(tmp_path):
    security = Security(user="u", password_file=str(tmp_path / "gone"))
    with pytest.raises(ClientError, match="'passwordfile'.*gone"):
        AmqpConnection("127.0.0.1:1", 1000, "test", security)


def test_the_client_refuses_plain_without_tls_to_a_node_off_this_host(password_file):
    with pytest.raises(ClientError, match="unencrypted"):
        AmqpConnection("192.0.2.1:5672", 1000, "test", Security(user="u", password_file=password_file))


def test_credential_errors_say_the_option():
    with pytest.raises(CredentialError) as error:
        password(Security(user="u", password_env="GROUPER_SURELY_UNSET_VARIABLE"), environ={})
    assert error.value.option == "passwordenv"
