"""Development certificates for TLS: a CA, node certificates and client certificates as PEM files in
one directory (`ca.pem`, `ca-key.pem`, `<name>.pem`, `<name>-key.pem`); `grouper certs` is
node/certs_commands.py.

Rules:
- For development, tests and docker-compose only. Keys are written unencrypted, mode 0600;
  production certificates come from the operator's own PKI.
- A file is never replaced unless `force` is given, and every file is checked before any is
  written, so a refusal leaves the directory as it was.
- An existing CA in the directory signs new certificates (adding a node later works); only `make_ca`
  (`certs ca`) replaces one, and `certs dev` makes one only when there is none.
- Node certificates serve and authenticate (serverAuth + clientAuth: nodes use mutual TLS) and
  always name the node's own host in their SANs; client certificates carry the user name as their
  subject CN, which SASL EXTERNAL takes as the user.
- Keys are EC P-256: generated in milliseconds (tests make many), small, and accepted by every TLS
  1.2+ stack we meet (OpenSSL under proton and Python, Java, .NET, Go).
- The validity window is an argument, so tests can make an expired certificate; by default it starts
  CLOCK_SKEW_ALLOWANCE in the past so hosts whose clocks lag accept a certificate made just now.
- Failures raise `InvalidConfig` naming the file or flag at fault and what to do.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from node.core.errors import InvalidConfig

CA_CERT_FILE = "ca.pem"
CA_KEY_FILE = "ca-key.pem"
CA_DAYS_DEFAULT = 3650
LEAF_DAYS_DEFAULT = 825  # the longest TLS server certificate Apple platforms accept
CLOCK_SKEW_ALLOWANCE = datetime.timedelta(minutes=5)
KEY_FILE_MODE = 0o600
CERT_FILE_MODE = 0o644
ORGANIZATION = "Grouper development"
DEV_NODES_DEFAULT = "node0,node1,node2"  # the docker-compose service names
DEV_CLIENT_DEFAULT = "admin"
DEV_HOSTS = ("localhost",)
DEV_IPS = ("127.0.0.1", "::1")

_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
_DNS_NAME = re.compile(r"(\*\.)?([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)*"
                       r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.?")


# ---- the Python API (tests use it directly) -----------------------------------------------------

def make_ca(directory, days: int = CA_DAYS_DEFAULT, *, force: bool = False) -> tuple[Path, Path]:
    directory = Path(directory)
    cert_path, key_path = directory / CA_CERT_FILE, directory / CA_KEY_FILE
    refuse_existing([cert_path, key_path], force, "replacing the CA leaves every certificate it signed untrusted")
    key = ec.generate_private_key(ec.SECP256R1())
    key_id = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    # A CA's own fingerprint in its name tells two development CAs apart when a chain fails.
    name = _name(f"Grouper development CA {key_id.digest[:4].hex()}")
    not_before = _now() - CLOCK_SKEW_ALLOWANCE
    certificate = (
        _builder(name, name, key.public_key(), not_before, not_before + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(key_cert_sign=True, crl_sign=True), critical=True)
        .add_extension(key_id, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(key_id), critical=False)
        .sign(key, hashes.SHA256()))
    _write_pair(directory, certificate, cert_path, key, key_path, force)
    return cert_path, key_path


def make_leaf(directory, name: str, *, dns=(), ips=(), client_only: bool = False, days: int = LEAF_DAYS_DEFAULT,
              not_before: datetime.datetime | None = None, not_after: datetime.datetime | None = None,
              force: bool = False) -> tuple[Path, Path]:
    """A node certificate (serverAuth + clientAuth, SANs: `name`, `dns`, `ips`) or, with
    `client_only`, a client certificate (clientAuth) whose CN `name` is the user; signed by the
    directory's CA."""
    directory = Path(directory)
    dns, ips = ([dns] if isinstance(dns, str) else dns), ([ips] if isinstance(ips, str) else ips)
    cert_path, key_path = leaf_paths(directory, name)
    own_name = [] if client_only else checked_dns_names([name], "NAME")
    dns_names = list(dict.fromkeys(own_name + checked_dns_names(dns, "--dns")))
    addresses = _ip_addresses(ips)
    not_before = not_before or _now() - CLOCK_SKEW_ALLOWANCE
    not_after = not_after or not_before + datetime.timedelta(days=days)
    if not_after <= not_before:
        raise InvalidConfig("--days", f"the certificate would end ({not_after}) before it starts ({not_before})")
    refuse_existing([cert_path, key_path], force)
    ca_certificate, ca_key = load_ca(directory)
    key = ec.generate_private_key(ec.SECP256R1())
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH] if client_only else [ExtendedKeyUsageOID.SERVER_AUTH,
                                                                     ExtendedKeyUsageOID.CLIENT_AUTH]
    builder = (
        _builder(_name(name), ca_certificate.subject, key.public_key(), not_before, not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(digital_signature=True), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(_authority_key_id(ca_certificate), critical=False))
    alternative_names = [x509.DNSName(host) for host in dns_names] + [x509.IPAddress(ip) for ip in addresses]
    if alternative_names:
        builder = builder.add_extension(x509.SubjectAlternativeName(alternative_names), critical=False)
    _write_pair(directory, builder.sign(ca_key, hashes.SHA256()), cert_path, key, key_path, force)
    return cert_path, key_path


def leaf_paths(directory, name: str, flag: str = "NAME") -> tuple[Path, Path]:
    if not _FILE_NAME.fullmatch(name) or name == "ca" or name.endswith("-key"):
        raise InvalidConfig(flag, f"{name!r} cannot name certificate files: use 1-64 letters, digits and ._@- "
                                    "(not 'ca', not ending in '-key')")
    return Path(directory) / f"{name}.pem", Path(directory) / f"{name}-key.pem"


def load_ca(directory) -> tuple[x509.Certificate, CertificateIssuerPrivateKeyTypes]:
    directory = Path(directory)
    cert_path, key_path = directory / CA_CERT_FILE, directory / CA_KEY_FILE
    missing = [path for path in (cert_path, key_path) if not path.exists()]
    if len(missing) == 2:
        raise InvalidConfig(str(cert_path), f"no CA to sign with: run `grouper certs ca --dir {directory}` first, "
                                            f"or copy the CA's {CA_CERT_FILE} and {CA_KEY_FILE} there")
    if missing:
        raise InvalidConfig(str(missing[0]), f"is missing, half a CA: restore it, or replace the CA with "
                                             f"`grouper certs ca --dir {directory} --force`")
    try:
        certificate = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (ValueError, TypeError) as error:
        raise InvalidConfig(str(directory), f"cannot read the CA ({error}): replace it with "
                                            f"`grouper certs ca --dir {directory} --force`") from None
    if certificate.public_key() != key.public_key():
        raise InvalidConfig(str(key_path), f"is not the key of {cert_path}: restore the pair, or replace both "
                                           f"with `grouper certs ca --dir {directory} --force`")
    if certificate.not_valid_after_utc <= _now():
        raise InvalidConfig(str(cert_path), f"the CA expired on {certificate.not_valid_after_utc:%Y-%m-%d}: "
                                            f"replace it with `grouper certs ca --dir {directory} --force`")
    return certificate, key


# ---- building blocks ----------------------------------------------------------------------------

def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(subject, issuer, public_key, not_before, not_after) -> x509.CertificateBuilder:
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number()).not_valid_before(not_before).not_valid_after(not_after))


def _key_usage(*, digital_signature=False, key_cert_sign=False, crl_sign=False) -> x509.KeyUsage:
    return x509.KeyUsage(digital_signature=digital_signature, content_commitment=False, key_encipherment=False,
                         data_encipherment=False, key_agreement=False, key_cert_sign=key_cert_sign,
                         crl_sign=crl_sign, encipher_only=False, decipher_only=False)


def _authority_key_id(ca_certificate: x509.Certificate) -> x509.AuthorityKeyIdentifier:
    try:  # a CA copied in from elsewhere may lack the extension
        subject_key_id = ca_certificate.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    except x509.ExtensionNotFound:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_certificate.public_key())
    return x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(subject_key_id)


def checked_dns_names(names, flag: str) -> list[str]:
    unique = list(dict.fromkeys(names))
    for name in unique:
        if is_ip(name):
            raise InvalidConfig(flag, f"{name!r} is an IP address: pass it with --ip")
        if not _DNS_NAME.fullmatch(name) or len(name) > 253:
            raise InvalidConfig(flag, f"{name!r} is not a DNS name (letters, digits, '-' and dots)")
    return unique


def _ip_addresses(ips) -> list:
    addresses = []
    for ip in ips:
        try:
            addresses.append(ipaddress.ip_address(ip))
        except ValueError:
            raise InvalidConfig("--ip", f"{ip!r} is not an IPv4 or IPv6 address") from None
    return list(dict.fromkeys(addresses))


def is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def refuse_existing(paths, force: bool, consequence: str = "") -> None:
    existing = [str(path) for path in paths if path.exists()]
    if existing and not force:
        verb, pronoun = ("exists", "it") if len(existing) == 1 else ("exist", "them")
        raise InvalidConfig(", ".join(existing), f"already {verb}; pass --force to replace {pronoun}"
                                                 f"{' (' + consequence + ')' if consequence else ''}")


def _write_pair(directory: Path, certificate, cert_path: Path, key, key_path: Path, force: bool) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    _write(key_path, key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()), KEY_FILE_MODE, force)
    _write(cert_path, certificate.public_bytes(serialization.Encoding.PEM), CERT_FILE_MODE, force)


def _write(path: Path, data: bytes, mode: int, force: bool) -> None:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    try:  # O_EXCL: a file made since _refuse_existing looked is still not replaced
        descriptor = os.open(path, flags, mode)
    except FileExistsError:
        raise InvalidConfig(str(path), "already exists; pass --force to replace it") from None
    with os.fdopen(descriptor, "wb") as file:
        os.fchmod(file.fileno(), mode)  # before the key is in it; a replaced file keeps its old mode otherwise
        file.write(data)
