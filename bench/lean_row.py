"""One grouped row from the command line: `python -m bench.lean --url ... --queue ...` against any AMQP 1.0 broker.

Rules:
- 1 producer and N consumers, bench/lean.py's processes, measured by clients.py; prints throughput,
  latency, order and client CPU as JSON (no broker CPU: the broker may be elsewhere).
- A password is never a flag (it would show in ps): --password-file, and only over TLS or to a
  loopback broker. Bad combinations end in the parser's error (exit 2).
"""

from __future__ import annotations

import argparse
import json
import ssl
import tempfile
from dataclasses import asdict
from pathlib import Path
from urllib.parse import urlsplit

from bench import clients
from node.client.endpoint import tls_context
from node.net import is_loopback

PASSWORD_FILE_MAX_BYTES = 4096


def read_password_file(path: str) -> str:
    """A password file's content, one trailing newline dropped (as a mounted Secret or `echo` leaves it)."""
    with open(path, "rb") as handle:
        data = handle.read(PASSWORD_FILE_MAX_BYTES + 1)
    if len(data) > PASSWORD_FILE_MAX_BYTES:
        raise ValueError(f"{path} is over {PASSWORD_FILE_MAX_BYTES} bytes: not a password file")
    text = data.decode("utf-8")
    for ending in ("\r\n", "\n"):
        if text.endswith(ending):
            return text[:-len(ending)]
    return text


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.lean", description="One grouped row against an AMQP 1.0 broker: 1 producer, N "
        "consumers, lean.py's clients; prints throughput, latency, order and client CPU as JSON.")
    parser.add_argument("--url", required=True, help="HOST:PORT or amqp://HOST:PORT of the broker")
    parser.add_argument("--queue", required=True, help="the queue to send to and consume from")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--prefetch", type=int, default=100)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--durable", action="store_true", help="set the header's durable flag")
    parser.add_argument("--rate", type=int, default=0, help="messages per second the producer offers (0: flat out)")
    parser.add_argument("--user", default="", help="SASL PLAIN user; its password comes from --password-file")
    parser.add_argument("--password-file", default="", help="a file holding the password (one trailing newline "
                        "is dropped), such as a mounted Kubernetes Secret")
    parser.add_argument("--tls", action="store_true", help="speak TLS (the broker's amqps port)")
    parser.add_argument("--ca", default="", help="PEM CAs for the broker's certificate (implies --tls; without "
                        "it the system's CAs)")
    return parser


def target_from_args(args, parse: argparse.ArgumentParser):
    """The Target a row from the command line sends to; bad combinations end in parse.error (exit 2)."""
    from bench.peers import Target

    if args.password_file and not args.user:
        parse.error("--password-file needs --user")
    if args.user and not args.password_file:
        parse.error("--user needs --password-file (a password is never a flag: it would show in ps)")
    tls = args.tls or bool(args.ca)
    parts = urlsplit(args.url if "//" in args.url else f"amqp://{args.url}")
    if not parts.hostname or parts.port is None:
        parse.error(f"--url {args.url!r} is not HOST:PORT")
    if parts.username is not None:
        parse.error("--url must not carry credentials; use --user and --password-file")
    if args.user and not tls and not is_loopback(parts.hostname):
        parse.error(f"--user would send its password unencrypted to {parts.hostname}; add --tls (and --ca)")
    password = ""
    if args.password_file:
        try:
            password = read_password_file(args.password_file)
        except (OSError, ValueError) as error:
            parse.error(f"--password-file: cannot read {args.password_file}: {error}")
    if args.ca:
        try:
            tls_context(args.ca)
        except (OSError, ssl.SSLError) as error:
            parse.error(f"--ca: cannot load {args.ca}: {error}")
    return Target("amqp", f"amqp://{parts.hostname}:{parts.port}", args.queue,
                  tuple((args.queue,) for _ in range(args.consumers)), user=args.user, password=password,
                  tls=tls, ca_file=args.ca)


def main(argv: list[str] | None = None) -> int:
    parse = parser()
    args = parse.parse_args(argv)
    target = target_from_args(args, parse)
    workload = clients.Workload(messages=args.messages, groups=args.groups, prefetch=args.prefetch,
                                durable=args.durable, consumers=args.consumers, rate_per_s=args.rate)
    with tempfile.TemporaryDirectory(prefix="grouper-lean-") as scratch:
        outcome = clients.measure(target, workload, lambda: 0.0, Path(scratch), 1)
    result = {key: value for key, value in asdict(outcome).items() if key != "broker_cpu_us_per_msg"}
    print(json.dumps(result, indent=1))
    return 0 if not outcome.errors and not outcome.lost and outcome.unique == args.messages else 1
