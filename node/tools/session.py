"""One connection of `grouper send`, `receive` or `browse` to a node, its faults turned into one line.

Rules:
- On a plain connection the SASL exchange is node/tools/handshake.py's (SCRAM-SHA-256 where the
  node offers it: pip's proton cannot), and proton's BlockingConnection takes the socket after it;
  over TLS proton does TLS and SASL PLAIN itself (a node offers PLAIN over TLS).
- A password goes only over TLS or to a loopback node: anything else is refused before dialling.
- Without --create every link carries the EXISTING_QUEUE_CAPABILITY (node/core/dispatch/addresses.py): the
  node refuses an unknown queue, naming the queues close to it, instead of creating one.
- Every fault is a ToolError whose text names who is at fault and what to do next.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from urllib.parse import urlsplit

from node.core.errors import InvalidConfig
from node.tools.handshake import HandshakeRefused, NotAmqp, authenticate, dialled, not_amqp_text

AMQP_NODE_ENV = "GROUPER_AMQP"  # default --node of these commands (GROUPER_NODE is the admin address)
AMQP_NODE_DEFAULT = "127.0.0.1:5672"  # `grouper node`'s default AMQP port, node0 of `grouper up`
USER_ENV = "GROUPER_USER"
PASSWORD_ENV = "GROUPER_PASSWORD"
CA_ENV = "GROUPER_CA"
CONNECT_TIMEOUT_S = 10.0  # TCP connect, SASL and open, each


class ToolError(Exception):
    """A fault a command reports in one line: the text names who is at fault and what to do."""


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
    from node.admin.arguments import password_from_stdin

    if args.password_stdin:
        return password_from_stdin()
    if os.environ.get(PASSWORD_ENV):
        return os.environ[PASSWORD_ENV]
    if not sys.stdin.isatty():
        raise InvalidConfig("--user", f"no password for {user}: pipe it in with --password-stdin, set "
                                      f"${PASSWORD_ENV}, or run on a terminal to be asked")
    import getpass

    return getpass.getpass(f"password for {user} at {where}: ")


def existing_queue_only():
    """A proton link option: the node must not create the queue this link names (node/core/dispatch/addresses.py)."""
    from proton.reactor import LinkOption

    from node.core.dispatch.addresses import EXISTING_QUEUE_CAPABILITY

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

        from node.net import is_loopback

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
