"""`grouper certs`: the development certificates of node/certs.py from the command line.

Rules:
- Only argument parsing and reporting: every certificate and file is node/certs.py's, which checks
  every file before any is written, so a refusal leaves the directory as it was.
- A refusal (`InvalidConfig`) is printed as `grouper certs COMMAND: what is wrong` and exits 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import NameOID

from node.certs import (CA_CERT_FILE, CA_DAYS_DEFAULT, CA_KEY_FILE, DEV_CLIENT_DEFAULT, DEV_HOSTS, DEV_IPS,
                        DEV_NODES_DEFAULT, LEAF_DAYS_DEFAULT, checked_dns_names, is_ip, leaf_paths, load_ca,
                        make_ca, make_leaf, refuse_existing)
from node.core.errors import InvalidConfig


def register(subparsers) -> None:
    certs = subparsers.add_parser(
        "certs", help="make development TLS certificates (a CA, nodes, clients)",
        description="Development TLS certificates as PEM files in --dir: a CA, node certificates (TLS server and "
                    "mutual-TLS client) and client certificates whose CN is the user. Not for production.")
    commands = certs.add_subparsers(dest="certs_command", required=True, metavar="{ca,node,client,dev}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--dir", required=True, type=Path, metavar="DIR", help="directory of the PEM files")
    common.add_argument("--force", action="store_true", help="replace existing files")

    def command(name: str, run, help_text: str, days_default: int) -> argparse.ArgumentParser:
        parser = commands.add_parser(name, parents=[common], help=help_text, description=help_text)
        parser.add_argument("--days", type=_days, default=days_default, metavar="N",
                            help=f"validity in days (default {days_default})")
        parser.set_defaults(run=lambda args: _run(run, args))
        return parser

    command("ca", _run_ca, f"make the development CA: {CA_CERT_FILE}, {CA_KEY_FILE}", CA_DAYS_DEFAULT)
    node = command("node", _run_node, "make a node certificate (TLS server and mutual-TLS client) signed by the "
                                      "directory's CA", LEAF_DAYS_DEFAULT)
    node.add_argument("name", metavar="NAME", help="the node's host name; always a SAN")
    node.add_argument("--dns", type=_list, action="extend", default=[], metavar="NAME,...",
                      help="more DNS names to put in the SANs")
    node.add_argument("--ip", type=_ip_list, action="extend", default=[], metavar="ADDRESS,...",
                      help="IP addresses to put in the SANs")
    client = command("client", _run_client, "make a client certificate whose CN is the user (SASL EXTERNAL)",
                     LEAF_DAYS_DEFAULT)
    client.add_argument("user", metavar="USER")
    dev = command("dev", _run_dev, "make a CA (unless the directory has one), every node's certificate (SANs: "
                                   f"its name, {', '.join(DEV_HOSTS + DEV_IPS)}) and a client certificate per --client; "
                                   "--days is the nodes' and clients' validity", LEAF_DAYS_DEFAULT)
    dev.add_argument("--nodes", type=_list, default=_list(DEV_NODES_DEFAULT), metavar="NAME,...",
                     help=f"node names (default {DEV_NODES_DEFAULT})")
    dev.add_argument("--client", type=_list, action="extend", metavar="USER,...",
                     help=f"users of the client certificates, repeatable (default {DEV_CLIENT_DEFAULT})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="grouper")
    register(parser.add_subparsers(dest="command", required=True))
    try:
        args = parser.parse_args(["certs", *(sys.argv[1:] if argv is None else argv)])
    except SystemExit as exit_:
        return int(exit_.code or 0)
    return args.run(args)


def _run(action, args) -> int:
    try:
        action(args)
    except InvalidConfig as error:
        print(f"grouper certs {args.certs_command}: {error}", file=sys.stderr)
        return 2
    return 0


def _run_ca(args) -> None:
    _report(make_ca(args.dir, args.days, force=args.force))


def _run_node(args) -> None:
    _report(make_leaf(args.dir, args.name, dns=args.dns, ips=args.ip, days=args.days, force=args.force))


def _run_client(args) -> None:
    _report(make_leaf(args.dir, args.user, client_only=True, days=args.days, force=args.force))


def _run_dev(args) -> None:
    names = list(dict.fromkeys(args.nodes))
    clients = list(dict.fromkeys(args.client or [DEV_CLIENT_DEFAULT]))  # every --client, not just the last
    for client in clients:
        if client in names:
            raise InvalidConfig("--client", f"{client!r} is also a node: the files would collide; pick another user")
    checked_dns_names(names, "--nodes")
    leaves = [*(path for name in names for path in leaf_paths(args.dir, name, "--nodes")),
              *(path for client in clients for path in leaf_paths(args.dir, client, "--client"))]
    refuse_existing(leaves, args.force)
    ca_paths = [args.dir / CA_CERT_FILE, args.dir / CA_KEY_FILE]
    if not any(path.exists() for path in ca_paths):
        _report(make_ca(args.dir))
    else:
        load_ca(args.dir)  # a half or broken CA fails here, before any leaf is written
        print(f"using the CA in {ca_paths[0]}")
    for name in names:
        _report(make_leaf(args.dir, name, dns=DEV_HOSTS, ips=DEV_IPS, days=args.days, force=args.force))
    for client in clients:
        _report(make_leaf(args.dir, client, client_only=True, days=args.days, force=args.force))


def _report(paths: tuple[Path, Path]) -> None:
    certificate = x509.load_pem_x509_certificate(paths[0].read_bytes())
    try:
        names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        alternative_names = "; SANs " + ", ".join(str(name.value) for name in names)
    except x509.ExtensionNotFound:
        alternative_names = ""
    common_name = certificate.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    print(f"wrote {paths[0]} and {paths[1]}: CN {common_name}{alternative_names}; "
          f"valid until {certificate.not_valid_after_utc:%Y-%m-%d}")


def _days(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of days >= 1, got {text!r}")
    return int(text)


def _list(text: str) -> list[str]:
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list, got {text!r}")
    return items


def _ip_list(text: str) -> list[str]:
    items = _list(text)
    for item in items:
        if not is_ip(item):
            raise argparse.ArgumentTypeError(f"{item!r} is not an IPv4 or IPv6 address")
    return items


if __name__ == "__main__":
    sys.exit(main())
