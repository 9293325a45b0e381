"""What a connection passes before the node serves it: admission, the SASL exchange, a deadline.

Engine loop thread only, but for the PLAIN checks' threads, which touch nothing but the users and
a lock (see below). Rules:
- A socket from an address that already has connections_per_address_max open is closed at once.
- Each accepted socket gets a SASL exchange (node/amqp/sasl.py) with the mechanisms the security
  policy offers on its listener; proton sees nothing of the client until the exchange named it.
- From accept to the client's AMQP open, at most handshake_timeout_ms: a client that stalls in
  TLS, SASL or before its open is closed, so a half-open client holds no connection slot for ever.
- On the TLS listener a socket is admitted at accept, before its handshake (`admit_tls`), so
  handshakes in progress count toward connections_per_address_max; a failed one ends its count.
- Failed logins are throttled by node.core.access.failed_logins: per source address, per claimed user name
  and per pair of both. An attempt a held key applies to is refused unchecked, before any password
  work (the SASL server asks `_held` once it knows the user name); a failed one is answered after
  the hold its failure started, with the socket's input paused meanwhile. Refusals are logged once
  per source address and reason. Only a failed check of credentials (PLAIN, SCRAM-SHA-256,
  EXTERNAL) counts: garbage, a wrong protocol header or a mechanism not offered guesses nothing, and
  an open node has nothing to guess, so those never make the node hold back an answer. A success
  resets no count; it trusts its (address, user) pair (failed_logins says why). Memory: at most
  failed_logins.KEYS_MAX (10,000) entries in each of its four tables, about 200 bytes each.
- PLAIN's key derivation (PBKDF2, a few ms) runs off the engine loop, on PLAIN_CHECK_THREADS
  threads niced PLAIN_CHECK_NICE below it, at most PLAIN_CHECKS_MAX at once (queued included; past
  it an attempt is refused with a temporary failure, uncounted); the connection's input is paused
  meanwhile and the result comes back through the engine's bridge, so proton objects and the SASL
  server are touched on the loop only. A guesser from many addresses then slows PLAIN logins, not
  other clients' traffic (bench/plain_flood.py measures it).
- proton never sees a client the gate did not let through, so proton's own error for it is not
  logged (`lost`): the gate's refusal line says why.
- The users file and the TLS files are looked at about once a second and reloaded when changed.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import threading

from node.amqp import tls
from node.amqp.bridge import BridgeFull
from node.core.access.admission import Admission
from node.core.access.failed_logins import FailedLogins

log = logging.getLogger("grouper.amqp")

PROVEN_MECHANISMS = frozenset({"PLAIN", "SCRAM-SHA-256", "EXTERNAL"})  # the ones that prove an identity
FILES_CHECK_INTERVAL_MS = 1000  # how often the users file and TLS files are looked at for changes
PLAIN_CHECK_THREADS = 2  # threads deriving PLAIN passwords' keys (hashlib's PBKDF2 releases the GIL)
PLAIN_CHECK_NICE = 10  # their scheduling niceness above the loop's: on a busy machine the loop's clients go first
PLAIN_CHECKS_MAX = 64  # PLAIN checks queued or running at once; each holds one password until checked


def _lower_priority() -> None:
    """A check thread's first act: yield the CPU to the engine loop (Linux nices threads one by one)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), PLAIN_CHECK_NICE)
    except (AttributeError, OSError):  # elsewhere, or not allowed: the same work at the same priority
        pass


class _Exchange:
    """A connection's `sasl`: its SASL server, whose PLAIN checks the gate runs off the loop."""

    def __init__(self, gate: "Gate", connection, server):
        self.gate, self.connection, self.server = gate, connection, server
        self.ready = None  # the step a finished check produced, for the connection's next call

    def received(self, data: bytes, now_ms: int):
        if self.ready is not None:
            step, self.ready = self.ready, None
            return step
        step = self.server.received(data, now_ms)
        if step.check is not None:
            self.gate._start_check(self, step.check)
            step = dataclasses.replace(step, check=None)
        return step


class Gate:
    def __init__(self, security, loop, clock_ms, config, tls_context=None):
        self.security = security
        self.loop = loop
        self.clock_ms = clock_ms
        self.config = config
        self.tls_context = tls_context
        self.admission = Admission(connections_per_address_max=config.connections_per_address_max)
        self.failed_logins = FailedLogins()  # engine loop only
        self._checks_lock = threading.Lock()  # the check threads end their count
        self._checks_running = 0  # queued or running
        self._check_threads: concurrent.futures.ThreadPoolExecutor | None = None
        self._deadlines: dict = {}  # Connection -> the time its AMQP open must have arrived by, ms
        self._files_checked_ms = 0
        self._tls_stamp = tls.files_stamp(config) if tls_context is not None else None

    def admit_tls(self, host: str) -> bool:
        """A socket of the TLS listener, before its handshake: counted toward its address's limit
        (the connection carries the count from then on), or refused."""
        reason = self.admission.opened(host, self.clock_ms())
        if reason is not None:
            if self.admission.refusal_should_be_logged(host, reason):
                log.warning("connection from %s refused: %s (logged once per address and reason)", host, reason)
            return False
        return True

    def tls_failed(self, host: str, error: BaseException) -> None:
        """A handshake admitted by `admit_tls` failed: its count ends."""
        self.admission.closed(host)
        reason = f"TLS handshake failed ({type(error).__name__})"
        if self.admission.refusal_should_be_logged(host, reason):
            log.warning("connection from %s refused: %s (logged once per address and reason)", host, reason)

    def connected(self, connection, ssl_object) -> None:
        now_ms = self.clock_ms()
        if not connection.admitted:  # a TLS connection was admitted before its handshake
            reason = self.admission.opened(connection.host, now_ms)
            if reason is not None:
                self._log_refusal(connection, reason)
                connection.refuse()
                return
            connection.admitted = True
        identity = tls.certificate_identity(ssl_object)
        server = self.security.sasl_server(now_ms, connection.tls, connection.host, identity,
                                           held=lambda user: self._held(connection.host, user), defer_plain=True)
        connection.sasl = _Exchange(self, connection, server)
        self._deadlines[connection] = now_ms + self.config.handshake_timeout_ms

    def authenticated(self, connection, step) -> None:
        connection.user = step.identity
        if step.mechanism in PROVEN_MECHANISMS:  # an anonymous success proves nobody
            self.failed_logins.succeeded(connection.host, step.identity, self.clock_ms())

    def failed(self, connection, step) -> None:
        now_ms = self.clock_ms()
        if step.failure:
            self._log_refusal(connection, step.failure)
        delay_ms = 0
        if step.held:  # refused unchecked: counts for the keys holding it
            delay_ms = self.failed_logins.refuse_if_held(connection.host, step.user, now_ms)[0]
        elif step.fault != "node" and step.mechanism in PROVEN_MECHANISMS:  # the node's own failure is no guess
            self.failed_logins.failed(connection.host, step.user, now_ms)
            delay_ms = self.failed_logins.held(connection.host, step.user, now_ms)[0]
        if delay_ms > 0:
            self.loop.call_later(delay_ms / 1000, connection.refuse, step.output)
        else:
            connection.refuse(step.output)

    def opened(self, connection) -> None:
        self._deadlines.pop(connection, None)

    def lost(self, connection) -> None:
        self._deadlines.pop(connection, None)
        if connection.user is None:  # proton's "no protocol header found" would be a line per attempt
            connection.error_logged = True
        if connection.admitted:
            connection.admitted = False
            self.admission.closed(connection.host)

    def tick(self, now_ms: int) -> bool:
        """Deadlines and file changes; True if the users and permissions in force changed."""
        if self._deadlines:
            late = [connection for connection, deadline_ms in self._deadlines.items() if deadline_ms <= now_ms]
            for connection in late:
                del self._deadlines[connection]
                self._log_refusal(connection, f"no AMQP open within handshake_timeout_ms "
                                              f"({self.config.handshake_timeout_ms} ms)")
                connection.refuse()
        if now_ms - self._files_checked_ms < FILES_CHECK_INTERVAL_MS:
            return False
        self._files_checked_ms = now_ms
        if self.tls_context is not None:
            stamp = tls.files_stamp(self.config)
            if stamp != self._tls_stamp:
                self._tls_stamp = stamp
                tls.reload(self.tls_context, self.config)
        return self.security.refresh()

    def reload_tls(self) -> None:
        """SIGHUP: load the TLS files again whether or not they look changed."""
        if self.tls_context is not None:
            self._tls_stamp = tls.files_stamp(self.config)
            tls.reload(self.tls_context, self.config)
        self.security.refresh()

    # ---- the throttle and PLAIN checks ---------------------------------------------------------

    def _held(self, host: str, user: str) -> str | None:
        held_ms, by = self.failed_logins.held(host, user, self.clock_ms())
        if held_ms <= 0:
            return None
        who = {"address": f"from {host}", "user": f"for user {user!r}", "pair": f"for user {user!r} from {host}"}[by]
        return f"too many failed logins in a row {who}: held for another {held_ms} ms"

    def _start_check(self, exchange: _Exchange, check: tuple[str, str]) -> None:
        connection = exchange.connection
        with self._checks_lock:
            full = self._checks_running >= PLAIN_CHECKS_MAX
            self._checks_running += not full
        if full:
            exchange.ready = exchange.server.check_refused(
                f"PLAIN: {PLAIN_CHECKS_MAX} password checks are waiting (PLAIN_CHECKS_MAX); retry shortly")
            self.loop.call_soon(self._deliver, exchange)
            return
        if self._check_threads is None:
            self._check_threads = concurrent.futures.ThreadPoolExecutor(
                PLAIN_CHECK_THREADS, "grouper-plain-check", initializer=_lower_priority)
        connection.socket.pause_reading()  # what the client sends meanwhile waits in the socket
        bridge = connection.engine.bridge
        user, password = check

        def verify():  # a check thread: no engine object is touched here
            try:
                verified = self.security.verify_plain(user, password)
            except Exception as error:  # the node's fault; SaslServer names it without its message
                verified = error
            with self._checks_lock:
                self._checks_running -= 1
            try:
                bridge.post(lambda: self._checked(exchange, verified))
            except BridgeFull:  # the node is overloaded: the handshake deadline closes the connection
                pass

        self._check_threads.submit(verify)

    def _checked(self, exchange: _Exchange, verified) -> None:
        """The loop, through the bridge: a check's result."""
        exchange.ready = exchange.server.checked(verified)
        self._deliver(exchange)

    def _deliver(self, exchange: _Exchange) -> None:
        connection = exchange.connection
        if connection.sasl is not exchange or connection.lost or connection.closing:
            return  # gone, timed out or refused meanwhile
        if exchange.ready.state == "authenticated" and not connection.output_paused:
            connection.socket.resume_reading()
        connection.data_received(b"")  # the connection takes `ready` as it takes any step

    def _log_refusal(self, connection, reason: str) -> None:
        if self.admission.refusal_should_be_logged(connection.host, reason):
            log.warning("connection from %s refused: %s (logged once per address and reason)", connection.peer,
                        reason)
