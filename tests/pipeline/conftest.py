"""One Spark session for the whole pipeline suite: local[2], bound to loopback.

Starting a session costs 6-9 s on this machine kind, so tests share it; each test uses its own
queues and paths so they cannot see each other's data.
"""

import os

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # else Spark binds the machine's external interface
os.environ.setdefault("PYSPARK_PYTHON", os.environ.get("PYSPARK_PYTHON", __import__("sys").executable))


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("grouper-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.driver.memory", "2g")
               .getOrCreate())
    session.sparkContext.setLogLevel("WARN")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def grouper_node(tmp_path_factory):
    """One node for the source and sink tests (queues auto-created, no fsync); each test uses its own queues."""
    from tests.integration.harness import NodeProcess

    node = NodeProcess(tmp_path_factory.mktemp("grouper") / "node", "", ("--no-fsync",)).start()
    yield node
    node.kill()


@pytest.fixture(scope="session")
def grouper_spark(spark):
    """The shared session with the "grouper" format registered."""
    import pipeline

    pipeline.register(spark)
    return spark


# ---- a secured node: a users file, TLS, client certificates (test_client_security, test_secured_sink) ----

SECURED_USER = "spark"  # an administrator, by password and by client certificate (CN)
SECURED_PASSWORD = "correct horse battery"
CLI_TIMEOUT_S = 60.0


@pytest.fixture(scope="session")
def security_files(tmp_path_factory):
    """Development certificates (a CA, the node's for 127.0.0.1, the user's client certificate; a
    second CA the node does not know, with a client certificate of the same name), the users file
    and a password file as a mounted Secret would hold it (one trailing newline)."""
    import subprocess
    import sys
    from types import SimpleNamespace

    from node import certs
    from tests.integration.harness import REPO

    root = tmp_path_factory.mktemp("security")
    ca, other_ca = root / "ca", root / "other-ca"
    ca.mkdir()
    other_ca.mkdir()
    certs.make_ca(ca)
    certs.make_ca(other_ca)
    node_cert, node_key = certs.make_leaf(ca, "localhost", ips=("127.0.0.1",))
    client = certs.make_leaf(ca, SECURED_USER, client_only=True)
    stranger = certs.make_leaf(other_ca, SECURED_USER, client_only=True)
    users_file = root / "users.json"
    added = subprocess.run([sys.executable, "-m", "node.cli", "user", "add", SECURED_USER, "--role", "administrator",
                            "--password-stdin", "--users-file", str(users_file)], cwd=REPO, capture_output=True,
                           text=True, input=SECURED_PASSWORD + "\n", timeout=CLI_TIMEOUT_S)
    assert added.returncode == 0, added.stderr
    password_file = root / "secret" / "password"
    password_file.parent.mkdir()
    password_file.write_text(SECURED_PASSWORD + "\n")
    return SimpleNamespace(ca_file=ca / certs.CA_CERT_FILE, other_ca_file=other_ca / certs.CA_CERT_FILE,
                           node_cert=node_cert, node_key=node_key, client=client, stranger=stranger,
                           users_file=users_file, password_file=password_file)


def amqps_address(node) -> str:
    """The node's `amqps: HOST:PORT` line (read from its output, printed before `ready`)."""
    for line in node.output:
        if line.startswith("amqps: "):
            return line.split(": ", 1)[1].strip()
    raise AssertionError("the node printed no amqps line:\n" + "\n".join(node.output))


def start_secured_node(data_dir, files):
    """A node with the users file, AMQP over TLS (client certificates of `files`' CA accepted) and
    its plain port for loopback clients (PLAIN there with --sasl-plain-on-loopback)."""
    from tests.integration.harness import NodeProcess

    return NodeProcess(data_dir, "", ("--no-fsync", "--users-file", str(files.users_file),
                                      "--tls-cert-file", str(files.node_cert), "--tls-key-file", str(files.node_key),
                                      "--tls-ca-file", str(files.ca_file), "--amqps-port", "0",
                                      "--sasl-plain-on-loopback")).start()


@pytest.fixture(scope="session")
def secured_node(tmp_path_factory, security_files):
    """Shared by the tests that log in successfully; a test that fails logins uses a node of its own
    (the node holds back failed outcomes from the 4th failure in a row from one address)."""
    node = start_secured_node(tmp_path_factory.mktemp("secured") / "node", security_files)
    yield node
    node.kill()
