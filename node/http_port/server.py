"""The node's HTTP server: /healthz, /readyz and /metrics for supervisors, and the web console.

Rules:
- The server runs on its own threads and owns nothing. Every answer comes from `NodeProbe`, whose
  reads of engine loop state go through the bridge with a short deadline, so a scrape never touches a
  proton object or the broker core from this thread.
- /healthz answers 200 while the process serves HTTP: a supervisor restarts a node only when it is
  truly wedged. /readyz answers 200 only when the node can serve (journal recovered, and in a cluster
  joined with a known raft leader and a caught-up replica); otherwise 503 with the reason in one line.
- /metrics is the Prometheus text format, built by `prometheus_client` from one snapshot per scrape
  (node/http_port/metrics.py; node/http_port/probes.py reads the snapshot of the node).
  An engine loop that does not answer in time makes it 503, not a page of stale numbers.
- Who may read what: /healthz and /readyz are open to every client (supervisors and load balancers
  carry no credentials). /metrics is open with metrics_auth "open" (as RabbitMQ's Prometheus plugin);
  with "basic" it needs HTTP basic auth by a user with `manage` on '#': 401 with a challenge without
  valid credentials, 403 for a user lacking the permission. "basic" on a node without a users file
  refuses to start: there would be nobody to check against.
- With http_tls_cert_file and http_tls_key_file the port speaks HTTPS only. The handshake runs on the
  request's thread, never the accepting one, and the files are read again when they change.
- Every connection is closed after REQUEST_TIMEOUT_S without a complete request.
- Every request's Host, and the Origin of every POST, pass node.http_port.hosts first (421 or 403 with
  what to do): the port answers only to names the node is known by, so a DNS rebinding page reaches
  nothing, probes included (they ask by address).
- `/`, `/console/...` and `/api/...` belong to the web console (node.console), which has its own rules;
  only it takes POSTs, with bodies of at most node.console.BODY_MAX_BYTES (a longer one is refused
  unread: 413).
"""

from __future__ import annotations

import json
import logging
import socket
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, generate_latest

from node.admin.callers import EVERY_QUEUE, Authenticator, Unauthenticated
from node.config import files_stamp
from node.console import BODY_MAX_BYTES, JSON
from node.core.access.roles import Permission
from node.core.errors import InvalidConfig
from node.http_port.hosts import HostPolicy, parse_names
from node.http_port.metrics import GrouperCollector
from node.net import is_loopback

log = logging.getLogger("grouper.health")

PROBE_TIMEOUT_MS = 2000  # an engine loop slower than this to answer a probe counts as not ready
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TEXT = "text/plain; charset=utf-8"
REQUEST_TIMEOUT_S = 10.0  # a connection idle (or handshaking) this long without a complete request is closed
METRICS_AUTH_OPEN, METRICS_AUTH_BASIC = "open", "basic"
CHALLENGE = 'Basic realm="grouper", charset="UTF-8"'  # WWW-Authenticate of a 401


class NodeProbe:
    """What the endpoints ask of a node; runtime.Node provides it."""

    def readiness(self) -> tuple[bool, str]: ...  # (ready, reason when not)

    def metrics_snapshot(self) -> dict: ...  # see GrouperCollector for the keys


class HealthServer:
    def __init__(self, probe, host: str, port: int, *, security=None, metrics_auth: str = METRICS_AUTH_OPEN,
                 tls_cert_file: str = "", tls_key_file: str = "", clock_ms=lambda: int(time.monotonic() * 1000),
                 console=None, advertise_host: str = "", allowed_hosts: str = ""):
        """`security`: node.security.Security, for metrics_auth "basic"; `tls_*`: serve HTTPS;
        `console`: node.console.Console, served at `/` and `/api/` (None: those answer 404);
        `advertise_host`, `allowed_hosts` (http_allowed_hosts): names answered besides `host`, the
        machine's name, IP addresses and loopback names."""
        self._probe = probe
        self._console = console
        registry = CollectorRegistry(auto_describe=False)
        registry.register(GrouperCollector(probe))
        self._registry = registry
        if metrics_auth not in (METRICS_AUTH_OPEN, METRICS_AUTH_BASIC):
            raise InvalidConfig("metrics_auth", f"expected open or basic, got {metrics_auth!r}")
        if metrics_auth == METRICS_AUTH_BASIC and (security is None or security.database is None):
            raise InvalidConfig("metrics_auth", "basic needs a users file to check against, and this node has none: "
                                                "add a user with manage on '#' (`grouper user add NAME --role "
                                                "administrator`), or leave metrics_auth open")
        self._security = security
        self._metrics_auth = metrics_auth
        warning = open_metrics_warning(metrics_auth, security is not None and security.database is not None, host)
        if warning:
            log.warning("%s", warning)
        self._authenticator = Authenticator(security)
        self._clock_ms = clock_ms
        self._tls = _TlsFiles(tls_cert_file, tls_key_file) if tls_cert_file else None
        try:
            names = parse_names(allowed_hosts)
        except ValueError as error:
            raise InvalidConfig("http_allowed_hosts", str(error)) from None
        self._hosts = HostPolicy((host, advertise_host, socket.gethostname(), *names), self.scheme)
        handler = type("Handler", (_Handler,), {"server_owner": self})
        self._httpd = _Server((host, port), handler, self._tls)
        self._httpd.daemon_threads = True
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    @property
    def scheme(self) -> str:
        return "https" if self._tls is not None else "http"

    def answer(self, path: str, authorization: str | None = None, source: str = "", *, method: str = "GET",
               query: str = "", content_type: str = "", body: bytes = b"", host: str | None = None,
               origin: str | None = None) -> tuple[int, str, bytes, dict]:
        """(status, content type, body, extra headers) for `method` on `path` with that Authorization header
        from address `source` (failed logins are throttled per source); `host`, `origin`: those headers."""
        refusal = self._hosts.refusal(method, host, origin)
        if refusal is not None:
            log.info("HTTP %s %s from %s refused (%d): Host %r, Origin %r", method, path[:100], source,
                     refusal.status, (host or "")[:100], (origin or "")[:100])
            if path == "/api" or path.startswith("/api/"):  # the console's script reads {"error": ...}
                return refusal.status, JSON, json.dumps({"error": refusal.message}).encode(), {}
            return refusal.status, TEXT, f"{refusal.message}\n".encode(), {}
        if self._console is not None and self._console.serves(path):
            return self._console.answer(method, f"{path}?{query}" if query else path, authorization, source,
                                        self._clock_ms(), content_type, body)
        if method != "GET":
            return 405, TEXT, f"{path} answers GET only\n".encode(), {"Allow": "GET"}
        if path == "/healthz":
            return 200, TEXT, b"ok\n", {}
        if path == "/readyz":
            ready, reason = self._probe.readiness()
            return (200, TEXT, b"ready\n", {}) if ready else (503, TEXT, f"not ready: {reason}\n".encode(), {})
        if path == "/metrics":
            refusal = self._refusal(authorization, source)
            if refusal is not None:
                return refusal
            try:
                return 200, PROMETHEUS_CONTENT_TYPE, generate_latest(self._registry), {}
            except TimeoutError as error:
                return 503, TEXT, f"metrics unavailable: {error}\n".encode(), {}
        return 404, TEXT, b"not found: try /healthz, /readyz or /metrics\n", {}

    def _refusal(self, authorization: str | None, source: str) -> tuple[int, str, bytes, dict] | None:
        if self._metrics_auth == METRICS_AUTH_OPEN:
            return None
        if authorization is None:
            return (401, TEXT, b"metrics need HTTP basic auth (metrics_auth is basic): give the name and password "
                               b"of a user with manage on '#'\n", {"WWW-Authenticate": CHALLENGE})
        try:
            caller = self._authenticator.identify(authorization, None, self._clock_ms(), source)
        except Unauthenticated as error:
            return 401, TEXT, f"{error.description}\n".encode(), {"WWW-Authenticate": CHALLENGE}
        if not self._security.access.allows(caller.user, Permission.MANAGE, EVERY_QUEUE):
            log.info("metrics refused to user %r: no manage on '#'", caller.user)
            return (403, TEXT, f"user {caller.user!r} may not read metrics: that needs manage on every queue "
                               f"('#'); an administrator can grant it with `grouper role set ROLE --allow "
                               f"manage:#`\n".encode(), {})
        return None


def open_metrics_warning(metrics_auth: str, secured: bool, host: str) -> str | None:
    """The start-up line of a node with users whose /metrics anyone beyond this machine may read."""
    if metrics_auth != METRICS_AUTH_OPEN or not secured or is_loopback(host):
        return None
    return (f"/metrics is open to anyone who reaches the HTTP port on {host}: it names queues, consumers and "
            f"members, but no messages or credentials. To ask scrapers for a user with manage on '#', set "
            f"metrics_auth = \"basic\" (--metrics-auth basic)")


class _Handler(BaseHTTPRequestHandler):
    server_owner: HealthServer
    protocol_version = "HTTP/1.1"

    timeout = REQUEST_TIMEOUT_S

    def setup(self):
        super().setup()  # applies `timeout` to the socket, so a stalled handshake ends too
        if isinstance(self.connection, ssl.SSLSocket):
            self.connection.do_handshake()

    def do_GET(self):  # noqa: N802 (the standard library's name)
        self._reply(b"")

    def do_POST(self):  # noqa: N802
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= BODY_MAX_BYTES:
            self.close_connection = True  # the body is left unread
            message = f"a request body needs a Content-Length of at most {BODY_MAX_BYTES} bytes; send less"
            self._send(413, JSON, json.dumps({"error": message}).encode(), {})  # only the console's API takes POSTs
            return
        self._reply(self.rfile.read(length))

    def _reply(self, request_body: bytes) -> None:
        path, _, query = self.path.partition("?")
        hosts = self.headers.get_all("Host") or []  # two are no name at all: refused as one
        self._send(*self.server_owner.answer(path, self.headers.get("Authorization"), self.client_address[0],
                                             method=self.command, query=query,
                                             content_type=self.headers.get("Content-Type", ""), body=request_body,
                                             host=", ".join(hosts) if hosts else None,
                                             origin=self.headers.get("Origin")))

    def _send(self, status: int, content_type: str, body: bytes, headers: dict) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):  # probes every few seconds: keep them out of the node's log
        log.debug("%s %s", self.address_string(), format % args)


class _TlsFiles:
    """The HTTPS certificate and key, loaded into one context again when their files change."""

    def __init__(self, cert_file: str, key_file: str):
        self._paths = (cert_file, key_file)
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._stamp = files_stamp(self._paths)
        self._load()


    def _load(self) -> None:
        try:
            self.context.load_cert_chain(*self._paths)
        except (OSError, ssl.SSLError) as error:
            raise InvalidConfig("http_tls_cert_file", f"cannot load {self._paths[0]} with key {self._paths[1]}: "
                                                      f"{error}") from None

    def refresh(self) -> None:
        """On the accepting thread, per connection: two stats, a load only when a file changed."""
        stamp = files_stamp(self._paths)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            self._load()
            log.info("HTTPS certificate reloaded from %s", self._paths[0])
        except InvalidConfig as error:
            log.error("HTTPS files not reloaded, the ones loaded before stay in force: %s", error.description)


class _Server(ThreadingHTTPServer):
    def __init__(self, address, handler, tls: _TlsFiles | None):
        self._tls_files = tls
        super().__init__(address, handler)
        if tls is not None:  # the handshake waits for the request's thread (_Handler.setup)
            self.socket = tls.context.wrap_socket(self.socket, server_side=True, do_handshake_on_connect=False)

    def get_request(self):
        if self._tls_files is not None:
            self._tls_files.refresh()
        return super().get_request()

    def handle_error(self, request, client_address):
        # a client that fails its handshake or hangs up is its own business; the default prints a traceback
        log.debug("HTTP connection from %s failed", client_address, exc_info=True)
