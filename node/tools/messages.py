"""`grouper send`, `grouper receive` and `grouper browse`: a newcomer's first grouped messages.

Rules:
- Clarity over speed: python-qpid-proton's BlockingConnection, one message at a time, each send
  waiting for its outcome. `grouper perf` (node/tools/perf.py) is the fast one.
- `send` numbers the messages of each group 1, 2, ... in the application property SEQ_PROPERTY and
  gives each the message id GROUP-SEQ, so `receive` can show a group's order at a glance; with several
  --group flags the messages go round-robin over the groups. It also names the message's identity as
  node traces read it (node/amqp/codec.py: "producer", one name per run, and "sequence", the same
  number), so a traced queue's `grouper audit` judges what `send` sent instead of calling it unexpected.
- `receive` accepts each message after printing it; with --hold it settles none of them and keeps the
  link open until Ctrl-C (or --hold-s), so the node keeps those groups with this consumer meanwhile and
  another receiver gets none of their messages. Closing releases them to the next consumer, their
  delivery count raised.
- `browse` attaches with distribution mode copy: it prints and never consumes.
- None of them creates a queue unless given --create: without it each link carries the
  EXISTING_QUEUE_CAPABILITY, and the node refuses an unknown name, naming the queues close to it
  (a typo must not make a cluster-wide queue). Other clients keep the node's auto-create.
- A consumer is named as the console and `grouper groups` name it: CONTAINER/LINK.
- On a plain connection the SASL exchange is node/tools/handshake.py's (SCRAM-SHA-256 where the
  node offers it), and proton takes the socket after it; over TLS proton does SASL PLAIN itself.
- Each line is `key=value` pairs, one message a line, in a fixed order (tests and grep read it).
- Faults: no node listening, a port that is not AMQP, refused credentials, a mechanism missing, an
  unknown queue: one line on stderr naming the fault and what to do, exit status EXIT_FAILED; bad
  flags exit EXIT_USAGE.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from contextlib import contextmanager
import time
from urllib.parse import urlsplit

from node.admin.commands import positive_int
from node.core.errors import InvalidConfig
from node.tools.handshake import HandshakeRefused, NotAmqp, authenticate, not_amqp_text

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
AMQP_NODE_ENV = "GROUPER_AMQP"  # default --node of these commands (GROUPER_NODE is the admin address)
AMQP_NODE_DEFAULT = "127.0.0.1:5672"  # `grouper node`'s default AMQP port, node0 of `grouper up`
USER_ENV = "GROUPER_USER"
PASSWORD_ENV = "GROUPER_PASSWORD"
CA_ENV = "GROUPER_CA"
SEQ_PROPERTY = "seq"  # application property: the message's number within its group, from 1
CONNECT_TIMEOUT_S = 10.0  # TCP connect, SASL and open, each
RECEIVE_TIMEOUT_S_DEFAULT = 2.0  # `receive` without --count, and `browse`: stop after this long without a message
COUNT_DEFAULT = 10  # messages `send` sends without --count
BODY_PRINTED_MAX_CHARS = 60  # a longer body is cut in the printed line
CREATE_HELP = ("create the queue if it does not exist (a node with auto-create on: in a cluster, on every node); "
               "without it an unknown queue is refused, naming the queues close to it")


class ToolError(Exception):
    """A fault a command reports in one line: the text names who is at fault and what to do."""


# ---- flags -----------------------------------------------------------------------------------

def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {value}")
    return value


def connection_flags() -> argparse.ArgumentParser:
    """--node and the credentials, spelled as the admin commands spell them (README: Security)."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--node", metavar="URL", help=f"the node's AMQP address, HOST:PORT or amqp[s]://HOST:PORT "
                                                      f"(default ${AMQP_NODE_ENV} or {AMQP_NODE_DEFAULT}, node0 "
                                                      f"of `grouper up`)")
    who = parent.add_argument_group("credentials (README: Security)")
    who.add_argument("--user", metavar="NAME", help=f"SASL PLAIN as NAME (default ${USER_ENV}); the password comes "
                                                    f"from --password-stdin, ${PASSWORD_ENV} or a prompt")
    who.add_argument("--password-stdin", action="store_true", help="read the password from one line of stdin")
    who.add_argument("--ca", metavar="PEM", help=f"talk TLS (amqps), trusting these CAs (default ${CA_ENV})")
    return parent


def register(subparsers) -> None:
    connection = connection_flags()
    send = subparsers.add_parser("send", parents=[connection], help="send grouped messages to a queue",
                                 description="Send --count messages round-robin over the --group(s), each "
                                             "numbered within its group, waiting for each outcome.")
    send.add_argument("queue", metavar="QUEUE")
    send.add_argument("--group", metavar="G", action="append", required=True,
                      help="group id; give it several times to spread the messages over several groups")
    send.add_argument("--count", type=positive_int, default=COUNT_DEFAULT, metavar="N",
                      help=f"messages in all (default {COUNT_DEFAULT})")
    send.add_argument("--body", metavar="TEXT", help="body of every message (default 'GROUP #SEQ')")
    send.add_argument("--durable", action="store_true", help="mark the messages durable")
    send.add_argument("--create", action="store_true", help=CREATE_HELP)
    send.set_defaults(run=lambda args: _run(_send, args))

    receive = subparsers.add_parser("receive", parents=[connection], help="consume messages from a queue",
                                    description="Print and accept each message (group, seq, id, delivery "
                                                "count, consumer); --hold leaves them unsettled until Ctrl-C.")
    receive.add_argument("queue", metavar="QUEUE")
    receive.add_argument("--count", type=positive_int, metavar="N", help="stop after N messages")
    receive.add_argument("--timeout-s", type=_positive_float, default=RECEIVE_TIMEOUT_S_DEFAULT, metavar="S",
                         help=f"stop after S seconds without a message (default {RECEIVE_TIMEOUT_S_DEFAULT})")
    receive.add_argument("--hold", action="store_true",
                         help="settle nothing and stay attached until Ctrl-C: the node keeps these groups "
                              "with this consumer meanwhile")
    receive.add_argument("--hold-s", type=_positive_float, metavar="S", help="with --hold: let go after S seconds")
    receive.add_argument("--create", action="store_true", help=CREATE_HELP)
    receive.set_defaults(run=lambda args: _run(_receive, args))

    browse = subparsers.add_parser("browse", parents=[connection], help="print a queue's messages without "
                                                                       "consuming them")
    browse.add_argument("queue", metavar="QUEUE")
    browse.add_argument("--count", type=positive_int, metavar="N", help="stop after N messages")
    browse.add_argument("--timeout-s", type=_positive_float, default=RECEIVE_TIMEOUT_S_DEFAULT, metavar="S",
                        help=f"stop after S seconds without a message (default {RECEIVE_TIMEOUT_S_DEFAULT})")
    browse.add_argument("--create", action="store_true", help=CREATE_HELP)
    browse.set_defaults(run=lambda args: _run(_browse, args))


# ---- connecting ------------------------------------------------------------------------------

def node_url(text: str) -> tuple[str, str, int]:
    """(scheme, host, port) of HOST:PORT or amqp[s]://HOST:PORT; InvalidConfig naming --node if neither."""
    parts = urlsplit(text if "//" in text else f"amqp://{text}")
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("amqp", "amqps") or not parts.hostname or parts.username or parts.path not in ("", "/"):
        raise InvalidConfig("--node", f"expected HOST:PORT or amqp[s]://HOST:PORT, got {text!r} (credentials go "
                                      f"in --user)")
    return parts.scheme, parts.hostname, port or (5671 if parts.scheme == "amqps" else 5672)


def password_for(user: str, args: argparse.Namespace, where: str) -> str:
    from node.admin.commands import password_from_stdin

    if args.password_stdin:
        return password_from_stdin()
    if os.environ.get(PASSWORD_ENV):
        return os.environ[PASSWORD_ENV]
    if not sys.stdin.isatty():
        raise InvalidConfig("--user", f"no password for {user}: pipe it in with --password-stdin, set "
                                      f"${PASSWORD_ENV}, or run on a terminal to be asked")
    import getpass

    return getpass.getpass(f"password for {user} at {where}: ")


@contextmanager
def dialled(sock: socket.socket):
    """While open, proton's reactor "connects" to this socket, already connected and authenticated,
    instead of dialling: python-qpid-proton has no public way to take a socket of ours. Its reactor
    dials through proton._io.IO.connect; the one BlockingConnection made inside takes `sock`."""
    from proton._io import IO

    dial = IO.__dict__["connect"]
    IO.connect = staticmethod(lambda address: sock)
    try:
        yield
    finally:
        IO.connect = dial


def existing_queue_only():
    """A proton link option: the node must not create the queue this link names (node/core/addresses.py)."""
    from proton.reactor import LinkOption

    from node.core.addresses import EXISTING_QUEUE_CAPABILITY

    class Option(LinkOption):
        def apply(self, link) -> None:
            terminus = link.target if link.is_sender else link.source
            terminus.capabilities.put_symbol(EXISTING_QUEUE_CAPABILITY)

    return Option()


class Session:
    """One BlockingConnection to a node, its faults turned into ToolError."""

    def __init__(self, args: argparse.Namespace):
        from proton import SSLDomain
        from proton.utils import BlockingConnection

        from node.security import is_loopback

        self.create = getattr(args, "create", False)
        scheme, host, port = node_url(args.node or os.environ.get(AMQP_NODE_ENV) or AMQP_NODE_DEFAULT)
        ca = args.ca or os.environ.get(CA_ENV, "")
        if ca:
            scheme = "amqps"
        self.where = f"{host}:{port}"
        user = args.user or os.environ.get(USER_ENV, "")
        if args.password_stdin and not user:
            raise InvalidConfig("--password-stdin", f"says whose password with --user NAME (or ${USER_ENV})")
        if user and scheme == "amqp" and not is_loopback(host):
            raise InvalidConfig("--user", f"the password would cross the network to {self.where} unencrypted: give "
                                          f"--ca PEM (TLS to the node's amqps port) or run on the node's host")
        password = password_for(user, args, self.where) if user else ""
        self.container_id = f"{os.path.basename(sys.argv[0]) or 'grouper'}-{os.getpid()}"
        if scheme == "amqps":  # proton does TLS and SASL; a node offers PLAIN over TLS
            domain = SSLDomain(SSLDomain.MODE_CLIENT)
            if ca:
                domain.set_trusted_ca_db(ca)
            domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
            options: dict = {}
            if user:
                options.update(user=user, password=password, allowed_mechs="PLAIN",
                               allow_insecure_mechs=True)  # proton cannot see that it is under TLS
            try:
                self.connection = BlockingConnection(f"{scheme}://{host}:{port}", timeout=CONNECT_TIMEOUT_S,
                                                     ssl_domain=domain, container_id=self.container_id, **options)
            except Exception as error:
                raise ToolError(self.describe(error, user)) from None
            return
        # plain AMQP: the SASL exchange is ours (node/tools/handshake.py: SCRAM-SHA-256, which this
        # proton cannot do), proton gets the socket after it
        sock = self._authenticated_socket(host, port, user, password)
        try:
            with dialled(sock):
                self.connection = BlockingConnection(f"amqp://{host}:{port}", timeout=CONNECT_TIMEOUT_S,
                                                     container_id=self.container_id, sasl_enabled=False)
        except Exception as error:
            sock.close()
            raise ToolError(self.describe(error, user)) from None

    def _authenticated_socket(self, host: str, port: int, user: str, password: str) -> socket.socket:
        try:
            sock = socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S)
        except socket.gaierror:
            raise ToolError(f"cannot resolve the host of {self.where}: give --node an address this machine can "
                            f"reach") from None
        except OSError as error:
            raise ToolError(f"no node listening at {self.where} ({error.strerror or error}): start one with "
                            f"`grouper up`, or give its AMQP address with --node") from None
        try:
            authenticate(sock, user, password)
        except NotAmqp as error:
            sock.close()
            raise ToolError(not_amqp_text(host, port, error.looks_like)) from None
        except HandshakeRefused as error:
            sock.close()
            raise ToolError(f"the node at {self.where} did not let this client in: {error}") from None
        except OSError as error:
            sock.close()
            raise ToolError(f"the SASL exchange with {self.where} failed: {error}") from None
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def describe(self, error: Exception, user: str = "", queue: str = "") -> str:
        text = str(error)
        if "Name or service not known" in text:
            return f"cannot resolve the host of {self.where}: give --node an address this machine can reach"
        if "Connection refused" in text:
            return (f"no node listening at {self.where} ({text.rsplit(', ', 1)[-1].strip(chr(39) + ')')}): start one "
                    f"with `grouper up`, or give its AMQP address with --node")
        condition = getattr(getattr(error, "link", None), "remote_condition", None)
        if condition is not None:  # the connection stands; the node refused or ended the link
            name, description = condition.name or "", condition.description or ""
            if name == "amqp:not-found" and not self.create and description.startswith(f"no queue {queue!r}"):
                return (f"{description} at {self.where}: check the name, or give --create to make it (or "
                        f"`grouper queue add {queue}` first)")
            if name == "amqp:not-found":
                return (f"queue {queue!r} does not exist on the node at {self.where}, which does not create queues "
                        f"on first use: create it with `grouper queue add {queue}` ({description})")
            if name == "amqp:unauthorized-access":
                return (f"the node at {self.where} refused access to {queue!r}: {description} (a role with the "
                        f"permission is granted with `grouper role set`)")
            return f"the node at {self.where} refused the link to {queue!r}: {name}: {description}"
        if "unauthorized-access" in text or "authentication" in text.lower() or "sasl" in text.lower():
            who = f"user {user!r}" if user else "an anonymous client"
            return (f"the node at {self.where} refused {who}: give a user and password it knows (--user, "
                    f"--password-stdin or ${PASSWORD_ENV}) ({text})")
        if "certificate verify failed" in text:
            return (f"the node's certificate at {self.where} was not verified: give --ca the CA that signed it, and "
                    f"--node the host name the certificate names (proton refused a certificate naming the IP address "
                    f"given in --node) ({text})")
        return f"talking to the node at {self.where} failed: {text}"

    def _no_create(self) -> list:
        """Link options: without --create, ask the node for an existing queue only."""
        return [] if self.create else [existing_queue_only()]

    def sender(self, queue: str):
        try:
            return self.connection.create_sender(queue, options=self._no_create())
        except Exception as error:
            raise ToolError(self.describe(error, queue=queue)) from None

    def receiver(self, queue: str, browse: bool = False):
        from proton.reactor import Copy

        try:
            # credit 0: each receive() grants one, so a --hold receiver takes no message it does not print
            link_name = f"{self.container_id}-{queue}"
            # the console's and `grouper groups`'s name of a consumer: its client (container) and link
            self.consumer = f"{self.container_id}/{link_name}"
            return self.connection.create_receiver(queue, credit=0, name=link_name,
                                                   options=([Copy()] if browse else []) + self._no_create())
        except Exception as error:
            raise ToolError(self.describe(error, queue=queue)) from None

    def close(self) -> None:
        try:
            self.connection.close()
        except Exception:  # the node may be gone already: nothing is left to tell it
            pass


def _run(command, args: argparse.Namespace) -> int:
    session = None
    try:
        session = Session(args)
        return command(session, args)
    except ToolError as error:
        print(f"grouper {args.command}: {error}", file=sys.stderr)
        return EXIT_FAILED
    except InvalidConfig as error:
        print(f"grouper {args.command}: bad input: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_OK
    finally:
        if session is not None:
            session.close()


# ---- the commands ----------------------------------------------------------------------------

def message_line(message, consumer: str) -> str:
    properties = message.properties or {}
    body = message.body
    if isinstance(body, (bytes, memoryview)):
        body = bytes(body).decode("utf-8", "replace")
    body = str(body)
    if len(body) > BODY_PRINTED_MAX_CHARS:
        body = body[:BODY_PRINTED_MAX_CHARS - 3] + "..."
    return (f"group={message.group_id} seq={properties.get(SEQ_PROPERTY, '-')} id={message.id} "
            f"delivery-count={message.delivery_count} consumer={consumer} body={body!r}")


def _send(session: Session, args: argparse.Namespace) -> int:
    from proton import Message
    from proton.utils import SendException

    from node.amqp.codec import TRACE_PRODUCER_KEY, TRACE_SEQUENCE_KEY  # here: the parser never imports proton

    sender = session.sender(args.queue)
    producer = f"grouper-send-{os.getpid()}-{int(time.time() * 1000)}"  # one identity per run: sequences restart at 1
    next_seq = dict.fromkeys(args.group, 0)
    for number in range(args.count):
        group = args.group[number % len(args.group)]
        next_seq[group] += 1
        seq = next_seq[group]
        body = args.body if args.body is not None else f"{group} #{seq}"
        message = Message(id=f"{group}-{seq}", group_id=group, durable=args.durable, body=body,
                          properties={SEQ_PROPERTY: seq, TRACE_PRODUCER_KEY: producer, TRACE_SEQUENCE_KEY: seq})
        try:
            sender.send(message, timeout=CONNECT_TIMEOUT_S)
        except SendException as error:
            raise ToolError(f"the node at {session.where} did not accept message {message.id} to {args.queue!r} "
                            f"(outcome {error.state}); {number} sent before it") from None
        except Exception as error:
            raise ToolError(session.describe(error, queue=args.queue)) from None
        print(f"sent group={group} seq={seq} id={message.id}", flush=True)
    print(f"{args.count} message(s) accepted by {session.where} into {args.queue}", flush=True)
    return EXIT_OK


def _take(session: Session, receiver, args: argparse.Namespace, settle) -> int:
    """Print messages until --count or --timeout-s of quiet; `settle` runs after each line."""
    from proton import Timeout

    count = 0
    while args.count is None or count < args.count:
        try:
            message = receiver.receive(timeout=args.timeout_s)
        except Timeout:
            break
        except Exception as error:
            raise ToolError(session.describe(error, queue=args.queue)) from None
        print(message_line(message, session.consumer), flush=True)
        settle(receiver)
        count += 1
    return count


def _receive(session: Session, args: argparse.Namespace) -> int:
    receiver = session.receiver(args.queue)
    count = _take(session, receiver, args, (lambda _: None) if args.hold else (lambda link: link.accept()))
    if not args.hold:
        print(f"{count} message(s) received and accepted", flush=True)
        return EXIT_OK
    # SIGTERM lets go as Ctrl-C does: the connection is closed, so the node hands the messages on at once
    signal.signal(signal.SIGTERM, _interrupt)
    until = f"for {args.hold_s:g} s" if args.hold_s else "until Ctrl-C"
    print(f"holding {count} message(s) unsettled {until}; their groups stay with this consumer", flush=True)
    deadline = time.monotonic() + args.hold_s if args.hold_s else None
    while deadline is None or time.monotonic() < deadline:
        # process the connection (heartbeats) in short slices, so Ctrl-C is taken promptly; the one credit
        # the last wait left open may still bring a message: it is printed and held too
        session.connection.container.process()
        while receiver.fetcher.has_message:
            print(message_line(receiver.fetcher.pop(), session.consumer), flush=True)
        time.sleep(0.1)
    return EXIT_OK


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _browse(session: Session, args: argparse.Namespace) -> int:
    receiver = session.receiver(args.queue, browse=True)

    def settle(link) -> None:  # a browser's copies carry no outcome; settle what the node left unsettled
        if link.fetcher.unsettled:
            link.settle()

    count = _take(session, receiver, args, settle)
    print(f"{count} message(s) browsed, none consumed", flush=True)
    return EXIT_OK
