"""What a connection passes before the node serves it: admission, the SASL exchange, a deadline.

Engine loop thread only. Rules:
- A socket from an address that already has connections_per_address_max open is closed at once.
- Each accepted socket gets a SASL exchange (node/amqp/sasl.py) with the mechanisms the security
  policy offers on its listener; proton sees nothing of the client until the exchange named it.
- From accept to the client's AMQP open, at most handshake_timeout_ms: a client that stalls in
  TLS, SASL or before its open is closed, so a half-open client holds no connection slot for ever.
- On the TLS listener a socket is admitted at accept, before its handshake (`admit_tls`), so
  handshakes in progress count toward connections_per_address_max; a failed one ends its count.
- A failed authentication is answered after the delay the admission's throttle asks for, with the
  socket's input paused meanwhile; refusals are logged once per source address and reason. Only a
  failed check of credentials (PLAIN, SCRAM-SHA-256, EXTERNAL) counts toward the throttle: garbage,
  a wrong protocol header or a mechanism not offered guesses nothing, and an open node has nothing
  to guess, so those never make the node hold back an answer.
- proton never sees a client the gate did not let through, so proton's own error for it is not
  logged (`lost`): the gate's refusal line says why.
- The users file and the TLS files are looked at about once a second and reloaded when changed.
"""

from __future__ import annotations

import logging

from node.amqp import tls
from node.core.admission import Admission

log = logging.getLogger("grouper.amqp")

PROVEN_MECHANISMS = frozenset({"PLAIN", "SCRAM-SHA-256", "EXTERNAL"})  # the ones that prove an identity
FILES_CHECK_INTERVAL_MS = 1000  # how often the users file and TLS files are looked at for changes


class Gate:
    def __init__(self, security, loop, clock_ms, config, tls_context=None):
        self.security = security
        self.loop = loop
        self.clock_ms = clock_ms
        self.config = config
        self.tls_context = tls_context
        self.admission = Admission(connections_per_address_max=config.connections_per_address_max)
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
        connection.sasl = self.security.sasl_server(now_ms, connection.tls, connection.host, identity)
        self._deadlines[connection] = now_ms + self.config.handshake_timeout_ms

    def authenticated(self, connection, step) -> None:
        connection.user = step.identity
        if step.mechanism in PROVEN_MECHANISMS:  # an anonymous success must not wipe a guesser's streak
            self.admission.succeeded(connection.host)

    def failed(self, connection, step) -> None:
        now_ms = self.clock_ms()
        if step.failure:
            self._log_refusal(connection, step.failure)
        # a guess is a failed check of credentials; the node's own failure throttles nobody
        if step.fault != "node" and step.mechanism in PROVEN_MECHANISMS:
            self.admission.failed(connection.host, now_ms)
        delay_ms = self.admission.delay_ms(connection.host, now_ms)
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

    def _log_refusal(self, connection, reason: str) -> None:
        if self.admission.refusal_should_be_logged(connection.host, reason):
            log.warning("connection from %s refused: %s (logged once per address and reason)", connection.peer,
                        reason)
