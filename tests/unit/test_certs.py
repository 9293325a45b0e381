"""Development certificates (`node.certs`) checked the way nodes and clients will use them: a real TLS
handshake over a socket pair between a server context like a node's (its certificate; peers must
present one the CA signed) and a client context that trusts only the directory's ca.pem. Both use
X509_STRICT, the default of Python 3.13, so the certificates keep working there."""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import socket
import ssl
import stat
import threading
from dataclasses import dataclass

import pytest
from cryptography import x509
from cryptography.x509 import verification
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from node import certs, certs_commands
from node.core.errors import InvalidConfig

HANDSHAKE_TIMEOUT_S = 10.0
EXIT_USAGE = 2
NOW = datetime.datetime.now(datetime.timezone.utc)
# OpenSSL's verify codes (x509_vfy.h); stable across versions, unlike the messages' wording.
CERT_HAS_EXPIRED = 10
SELF_SIGNED_CERT_IN_CHAIN = 19
UNABLE_TO_GET_ISSUER_CERT_LOCALLY = 20
HOSTNAME_MISMATCH = 62


@pytest.fixture
def directory(tmp_path):
    assert certs_commands.main(["dev", "--dir", str(tmp_path), "--nodes", "node1,node2,node3", "--client", "admin"]) == 0
    return tmp_path


def certificate(path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def extension(cert: x509.Certificate, kind):
    return cert.extensions.get_extension_for_class(kind).value


# ---- a real handshake ---------------------------------------------------------------------------

@dataclass
class Handshake:
    client_error: Exception | None
    server_error: Exception | None
    client_certificate: dict | None  # as the server sees it: what SASL EXTERNAL reads the CN from

    @property
    def succeeded(self) -> bool:
        return self.client_error is None and self.server_error is None


def node_server(directory, name: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(directory / f"{name}.pem", directory / f"{name}-key.pem")
    context.load_verify_locations(directory / "ca.pem")
    context.verify_mode = ssl.CERT_REQUIRED
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    return context


def client(trusted_ca, cert_path=None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=trusted_ca)
    context.verify_flags |= ssl.VERIFY_X509_STRICT
    if cert_path is not None:
        context.load_cert_chain(cert_path, cert_path.with_name(cert_path.stem + "-key.pem"))
    return context


def handshake(server: ssl.SSLContext, client_context: ssl.SSLContext, server_hostname: str) -> Handshake:
    server_socket, client_socket = socket.socketpair()
    server_socket.settimeout(HANDSHAKE_TIMEOUT_S)
    client_socket.settimeout(HANDSHAKE_TIMEOUT_S)
    seen: dict = {"client_error": None, "server_error": None, "client_certificate": None}

    def serve():
        try:
            with server.wrap_socket(server_socket, server_side=True) as tls:
                seen["client_certificate"] = tls.getpeercert()
                tls.sendall(b"ok")
        except (ssl.SSLError, OSError) as error:
            seen["server_error"] = error

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with client_context.wrap_socket(client_socket, server_hostname=server_hostname) as tls:
            # TLS 1.3: the server judges the client's certificate after the client's handshake is done.
            assert tls.recv(2) == b"ok"
    except (ssl.SSLError, OSError) as error:
        seen["client_error"] = error
    thread.join(HANDSHAKE_TIMEOUT_S)
    assert not thread.is_alive(), "the server side of the handshake hung"
    server_socket.close()
    client_socket.close()
    return Handshake(**seen)


# ---- what the certificates say ------------------------------------------------------------------

def test_the_ca_is_a_self_signed_certificate_authority_valid_for_ten_years(directory):
    ca = certificate(directory / "ca.pem")
    assert ca.subject == ca.issuer
    ca.verify_directly_issued_by(ca)
    assert extension(ca, x509.BasicConstraints).ca
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).critical
    assert extension(ca, x509.KeyUsage).key_cert_sign
    assert (ca.not_valid_after_utc - ca.not_valid_before_utc).days == certs.CA_DAYS_DEFAULT


def test_a_node_certificate_names_its_host_localhost_and_loopback_and_serves_and_authenticates(directory):
    node = certificate(directory / "node2.pem")
    names = extension(node, x509.SubjectAlternativeName)
    assert names.get_values_for_type(x509.DNSName) == ["node2", "localhost"]
    assert ipaddress.ip_address("127.0.0.1") in names.get_values_for_type(x509.IPAddress)
    assert list(extension(node, x509.ExtendedKeyUsage)) == [ExtendedKeyUsageOID.SERVER_AUTH,
                                                            ExtendedKeyUsageOID.CLIENT_AUTH]
    assert not extension(node, x509.BasicConstraints).ca
    assert (node.not_valid_after_utc - node.not_valid_before_utc).days == certs.LEAF_DAYS_DEFAULT


def test_a_client_certificate_carries_the_user_as_its_cn_and_only_authenticates(directory):
    admin = certificate(directory / "admin.pem")
    assert admin.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "admin"
    assert list(extension(admin, x509.ExtendedKeyUsage)) == [ExtendedKeyUsageOID.CLIENT_AUTH]


def test_node_certificates_chain_to_the_ca_for_every_san_by_cryptographys_verifier(directory):
    store = verification.Store([certificate(directory / "ca.pem")])
    for subject in (verification.DNSName("node1"), verification.DNSName("localhost"),
                    verification.IPAddress(ipaddress.ip_address("127.0.0.1"))):
        verifier = verification.PolicyBuilder().store(store).build_server_verifier(subject)
        chain = verifier.verify(certificate(directory / "node1.pem"), [])
        assert chain[-1] == certificate(directory / "ca.pem")


def test_key_files_are_readable_by_their_owner_only(directory):
    for key in directory.glob("*-key.pem"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    assert len(list(directory.glob("*-key.pem"))) == 5  # the CA, three nodes, one client


# ---- handshakes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("host", ["node1", "localhost", "127.0.0.1"])
def test_a_client_trusting_the_ca_reaches_a_node_by_each_of_its_names_and_the_node_reads_the_user(directory, host):
    result = handshake(node_server(directory, "node1"), client(directory / "ca.pem", directory / "admin.pem"), host)
    assert result.succeeded, result
    assert (("commonName", "admin"),) in result.client_certificate["subject"]


def test_nodes_authenticate_each_other_with_their_node_certificates(directory):
    result = handshake(node_server(directory, "node2"), client(directory / "ca.pem", directory / "node3.pem"), "node2")
    assert result.succeeded, result
    assert (("commonName", "node3"),) in result.client_certificate["subject"]


def test_a_name_not_in_the_sans_fails_the_handshake(directory):
    result = handshake(node_server(directory, "node1"), client(directory / "ca.pem", directory / "admin.pem"), "node2")
    assert isinstance(result.client_error, ssl.SSLCertVerificationError)
    assert result.client_error.verify_code == HOSTNAME_MISMATCH


def test_an_expired_node_certificate_fails_the_handshake(directory):
    certs.make_leaf(directory, "old", dns=["old"], not_before=NOW - datetime.timedelta(days=10),
                    not_after=NOW - datetime.timedelta(days=1))
    result = handshake(node_server(directory, "old"), client(directory / "ca.pem", directory / "admin.pem"), "old")
    assert isinstance(result.client_error, ssl.SSLCertVerificationError)
    assert result.client_error.verify_code == CERT_HAS_EXPIRED


def test_a_node_certificate_from_another_ca_fails_the_handshake(directory, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    certs.make_ca(elsewhere, 30)
    certs.make_leaf(elsewhere, "node1", dns=["localhost"])
    result = handshake(node_server(elsewhere, "node1"), client(directory / "ca.pem", directory / "admin.pem"), "node1")
    # The node completes its chain from its own trust store, so the client is shown a foreign root.
    assert isinstance(result.client_error, ssl.SSLCertVerificationError)
    assert result.client_error.verify_code == SELF_SIGNED_CERT_IN_CHAIN


def test_a_node_refuses_an_expired_client_certificate(directory):
    certs.make_leaf(directory, "late", client_only=True, not_before=NOW - datetime.timedelta(days=10),
                    not_after=NOW - datetime.timedelta(days=1))
    result = handshake(node_server(directory, "node1"), client(directory / "ca.pem", directory / "late.pem"), "node1")
    assert isinstance(result.server_error, ssl.SSLCertVerificationError)
    assert result.server_error.verify_code == CERT_HAS_EXPIRED
    assert isinstance(result.client_error, ssl.SSLError)


def test_a_node_refuses_a_client_certificate_from_another_ca(directory, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    certs.make_ca(elsewhere)
    certs.make_leaf(elsewhere, "mallory", client_only=True)
    result = handshake(node_server(directory, "node1"), client(directory / "ca.pem", elsewhere / "mallory.pem"),
                       "node1")
    assert isinstance(result.server_error, ssl.SSLCertVerificationError)
    assert result.server_error.verify_code == UNABLE_TO_GET_ISSUER_CERT_LOCALLY


# ---- files and the command line -----------------------------------------------------------------

def test_existing_files_are_kept_without_force_and_replaced_with_it(directory, capsys):
    before = (directory / "node1.pem").read_bytes(), (directory / "node1-key.pem").read_bytes()
    assert certs_commands.main(["node", "node1", "--dir", str(directory)]) == EXIT_USAGE
    assert "node1-key.pem: already exist; pass --force to replace them" in capsys.readouterr().err
    assert ((directory / "node1.pem").read_bytes(), (directory / "node1-key.pem").read_bytes()) == before
    with pytest.raises(InvalidConfig, match="--force"):
        certs.make_ca(directory)
    assert certs_commands.main(["node", "node1", "--dir", str(directory), "--force"]) == 0
    assert (directory / "node1-key.pem").read_bytes() != before[1]
    assert stat.S_IMODE((directory / "node1-key.pem").stat().st_mode) == 0o600


def test_dev_refuses_before_writing_anything_when_one_file_exists(tmp_path, capsys):
    (tmp_path / "node2.pem").write_text("mine")
    assert certs_commands.main(["dev", "--dir", str(tmp_path), "--nodes", "node1,node2"]) == EXIT_USAGE
    assert "node2.pem: already exists; pass --force" in capsys.readouterr().err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["node2.pem"]


def test_a_node_added_later_is_signed_by_the_existing_ca(directory):
    ca_before = (directory / "ca.pem").read_bytes()
    assert certs_commands.main(["node", "node4", "--dir", str(directory), "--dns", "node4.grouper.svc", "--ip",
                       "10.0.0.4", "--days", "30"]) == 0
    assert (directory / "ca.pem").read_bytes() == ca_before
    node4 = certificate(directory / "node4.pem")
    node4.verify_directly_issued_by(certificate(directory / "ca.pem"))
    names = extension(node4, x509.SubjectAlternativeName)
    assert names.get_values_for_type(x509.DNSName) == ["node4", "node4.grouper.svc"]
    assert names.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.4")]
    assert (node4.not_valid_after_utc - node4.not_valid_before_utc).days == 30


def test_signing_without_a_ca_says_how_to_make_one(tmp_path, capsys):
    assert certs_commands.main(["client", "bob", "--dir", str(tmp_path)]) == EXIT_USAGE
    assert f"run `grouper certs ca --dir {tmp_path}` first" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flags, complaint", [
    (["--ip", "300.1.1.1"], "argument --ip: '300.1.1.1' is not an IPv4 or IPv6 address"),
    (["--dns", "127.0.0.1"], "--dns: '127.0.0.1' is an IP address: pass it with --ip"),
    (["--dns", "bad name"], "--dns: 'bad name' is not a DNS name"),
])
def test_bad_names_and_addresses_are_refused_with_usage_errors(directory, capsys, flags, complaint):
    assert certs_commands.main(["node", "node5", "--dir", str(directory), *flags]) == EXIT_USAGE
    assert complaint in capsys.readouterr().err
    assert not (directory / "node5.pem").exists()


def test_register_adds_certs_to_a_grouper_style_parser(tmp_path):
    parser = argparse.ArgumentParser(prog="grouper")
    certs_commands.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["certs", "ca", "--dir", str(tmp_path), "--days", "7"])
    assert args.run(args) == 0
    ca = certificate(tmp_path / "ca.pem")
    assert (ca.not_valid_after_utc - ca.not_valid_before_utc).days == 7


def test_dev_keeps_every_client_given(tmp_path):
    """Issue 26 finding 7: `--client alice --client bob` made only bob's certificate."""
    assert certs_commands.main(["dev", "--dir", str(tmp_path), "--nodes", "node1", "--client", "alice",
                       "--client", "bob,carol"]) == 0
    for user in ("alice", "bob", "carol"):
        cert_path, key_path = certs.leaf_paths(tmp_path, user)
        assert certificate(cert_path).subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == user
        assert stat.S_IMODE(key_path.stat().st_mode) == 0o600


def test_dev_makes_the_default_client_when_none_is_given(tmp_path):
    assert certs_commands.main(["dev", "--dir", str(tmp_path), "--nodes", "node1"]) == 0
    assert certs.leaf_paths(tmp_path, certs.DEV_CLIENT_DEFAULT)[0].exists()


def test_dev_refuses_a_client_named_like_a_node_among_several(tmp_path, capsys):
    assert certs_commands.main(["dev", "--dir", str(tmp_path), "--nodes", "node1", "--client", "alice",
                       "--client", "node1"]) == EXIT_USAGE
    assert "'node1' is also a node" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())
