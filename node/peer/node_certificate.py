"""A node certificate: the three cluster TLS files read and checked, and what a peer's certificate names.

Rules:
- A node's certificate is for serverAuth and clientAuth, named in its extended key usage: it serves
  the peer port and dials the other nodes' with it; a certificate without the extension is refused,
  here and by the peers (`node_usages`), so a client's certificate from the same CA cannot pass.
- `read_tls_material` checks the files at start and on each reload (key matches certificate,
  certificate signed by the CA, both usages, not expired) and raises InvalidConfig naming the setting
  and file at fault.
- `certificate_hosts` and `canonical_host` read the hosts a certificate names as a TLS client checks
  them, so the peer listener binds a batch's claimed source to the caller's certificate.
- Pure: parsing and checking only, no files kept, no clock (`now` is passed in), no gRPC.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from node.amqp.tls import read_pem
from node.core.errors import InvalidConfig


@dataclass(frozen=True)
class TlsMaterial:
    certificate_chain: bytes
    private_key: bytes
    ca_certificates: bytes
    common_name: str
    not_after: datetime.datetime


def read_tls_material(cert_file: str, key_file: str, ca_file: str, now: datetime.datetime) -> TlsMaterial:
    """Reads and checks the three files; InvalidConfig names the setting and file at fault."""
    certificate_chain = read_pem(cert_file, "cluster_tls_cert_file")
    private_key = read_pem(key_file, "cluster_tls_key_file")
    ca_certificates = read_pem(ca_file, "cluster_tls_ca_file")
    try:
        chain = x509.load_pem_x509_certificates(certificate_chain)
    except ValueError:
        raise InvalidConfig("cluster_tls_cert_file", f"{cert_file} holds no PEM certificate") from None
    try:
        cas = x509.load_pem_x509_certificates(ca_certificates)
    except ValueError:
        raise InvalidConfig("cluster_tls_ca_file", f"{ca_file} holds no PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(private_key, password=None)
    except (ValueError, TypeError) as error:
        raise InvalidConfig("cluster_tls_key_file", f"{key_file} holds no unencrypted PEM private key "
                                                    f"({error})") from None
    leaf = chain[0]
    if key.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo) != \
            leaf.public_key().public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo):
        raise InvalidConfig("cluster_tls_key_file", f"{key_file} is not the key of {cert_file}")
    issuers = chain[1:] + cas
    if not any(_issued_by(leaf, issuer) for issuer in issuers):
        raise InvalidConfig("cluster_tls_cert_file", f"{cert_file} (issuer {leaf.issuer.rfc4514_string()}) is not "
                                                     f"signed by a CA in {ca_file}: the other nodes would refuse it")
    missing = sorted({"serverAuth", "clientAuth"} - node_usages(leaf))
    if missing:
        raise InvalidConfig("cluster_tls_cert_file", f"{cert_file} lacks extended key usage {', '.join(missing)}: a "
                                                     f"node serves and dials with one certificate; make one with "
                                                     f"`grouper certs node NAME`")
    if leaf.not_valid_after_utc <= now:
        raise InvalidConfig("cluster_tls_cert_file",
                            f"{cert_file} expired on {leaf.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")
    names = leaf.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return TlsMaterial(certificate_chain, private_key, ca_certificates,
                       str(names[0].value) if names else leaf.subject.rfc4514_string(), leaf.not_valid_after_utc)


def certificate_hosts(certificate: x509.Certificate) -> frozenset[str]:
    """The hosts a certificate names, as a TLS client checks them: its DNS names (lower case) and IP
    addresses (canonical text); its subject CN only when it has no subjectAltName (RFC 6125)."""
    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        common = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
        return frozenset(canonical_host(str(common[0].value)) for _ in common[:1])
    return frozenset([name.lower() for name in names.get_values_for_type(x509.DNSName)]
                     + [str(address) for address in names.get_values_for_type(x509.IPAddress)])


def canonical_host(host: str) -> str:
    """A host as certificate_hosts writes it: an IP address in canonical text, a name in lower case."""
    host = host.strip("[]")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.lower()


def node_usages(certificate: x509.Certificate) -> set[str]:
    """The TLS usages a certificate's extended key usage names: 'serverAuth', 'clientAuth'. None without
    the extension: RFC 5280 lets such a certificate serve any purpose, but a node certificate must say
    it is one (`grouper certs node` writes both), so another certificate of the same CA cannot pass."""
    try:
        usages = certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except x509.ExtensionNotFound:
        return set()
    found = set()
    if ExtendedKeyUsageOID.SERVER_AUTH in usages:
        found.add("serverAuth")
    if ExtendedKeyUsageOID.CLIENT_AUTH in usages:
        found.add("clientAuth")
    return found


def _issued_by(certificate: x509.Certificate, issuer: x509.Certificate) -> bool:
    try:
        certificate.verify_directly_issued_by(issuer)
    except (InvalidSignature, ValueError, TypeError):  # a bad signature, another issuer's name, a key type
        return False
    return True
