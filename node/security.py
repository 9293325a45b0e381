"""Who may connect and how: the node's security policy, from its config and its user database.

Rules:
- No user database (its file is absent): every client is anonymous and may do everything. A node
  runs like that only on a loopback host, or when the operator says so with allow_anonymous.
- With a user database: SCRAM-SHA-256 always; PLAIN over TLS, or without TLS from a loopback client
  when sasl_plain_on_loopback says so (PLAIN sends the password itself); EXTERNAL when the client
  showed a certificate our CA signed; ANONYMOUS only with allow_anonymous, and anonymous clients get
  the database's anonymous roles.
- The database is read again when its file changes (`refresh`, from the engine loop's tick): new
  connections and new links see the new users and permissions, open links keep what they were
  granted. A file that no longer reads keeps the database in force and is logged once per change.
  A node started without the file turns secured when it appears (logged); one whose file goes away
  keeps the users it read.
- Passwords are checked here, once per connection, never per message. PLAIN derives a key (PBKDF2,
  4096 rounds, a few ms): the AMQP gate runs that off the engine loop, and only for attempts its
  throttle lets through (node/amqp/gate.py); the admin port on its pool threads. SCRAM-SHA-256
  costs the node a few HMACs, on the loop. A user the file does not have meets a decoy
  (node/user_decoys.py), computed for known users too.
"""

from __future__ import annotations

import logging
import os

from node.amqp.sasl import SaslServer
from node.core.access.roles import Access
from node.core.errors import GrouperError, InvalidConfig
from node.net import is_loopback
from node.users import UserDatabase, bootstrap
from node.users_file import stamp

log = logging.getLogger("grouper.security")

SCRAM, PLAIN, EXTERNAL, ANONYMOUS = "SCRAM-SHA-256", "PLAIN", "EXTERNAL", "ANONYMOUS"


class Security:
    def __init__(self, config, users_path: str, database: UserDatabase | None):
        self.config = config
        self.users_path = users_path
        self.database = database
        self.access = database.access() if database is not None else Access.open()
        self._file_stamp = stamp(users_path)
        self._bad_stamp = None  # the stamp of a file that did not read, logged once
        from node.admin.callers import LoginThrottle
        # failed logins per source address on the admin port and /metrics, one throttle for both
        # (the AMQP gate keeps its own, on the engine loop)
        self.login_throttle = LoginThrottle()

    @classmethod
    def from_config(cls, config, environ=None) -> "Security":
        """Bootstraps the first administrator if asked, reads the database, and refuses an open node
        on a non-loopback host unless allow_anonymous says so."""
        path = config.users_path()
        created = bootstrap(path, os.environ if environ is None else environ,
                            password_chars_min=config.password_chars_min)
        if created:
            log.info("created %s with administrator %r (GROUPER_DEFAULT_USER)", path, created)
        database = UserDatabase.load(path) if os.path.exists(path) else None
        if database is None and not config.allow_anonymous and not is_loopback(config.host):
            raise InvalidConfig("host", f"{config.host} is not a loopback address and there is no user database "
                                        f"({path}): add a user with `grouper user add NAME --role administrator "
                                        f"--data-dir {config.data_dir}`, or pass --allow-anonymous to let anyone in")
        return cls(config, path, database)

    @property
    def open(self) -> bool:
        return self.database is None

    def describe(self) -> str:
        if self.database is None:
            return f"open: no user database at {self.users_path}, every client is anonymous and may do everything"
        anonymous = ", anonymous clients allowed" if self.config.allow_anonymous else ""
        return f"secured: {len(self.database.users())} users in {self.users_path}{anonymous}"

    def mechanisms(self, tls: bool, client_host: str, certificate_identity: str | None) -> tuple[str, ...]:
        if self.database is None:
            return (ANONYMOUS,)
        offered = [SCRAM]
        if tls or (self.config.sasl_plain_on_loopback and is_loopback(client_host)):
            offered.append(PLAIN)
        if certificate_identity is not None:
            offered.append(EXTERNAL)
        if self.config.allow_anonymous:
            offered.append(ANONYMOUS)
        return tuple(offered)

    def sasl_server(self, now_ms: int, tls: bool, client_host: str, certificate_identity: str | None, *,
                    held=None, defer_plain: bool = False) -> SaslServer:
        """`held` and `defer_plain`: the gate's (node/amqp/sasl.py says what they do)."""
        if certificate_identity is not None and self.scram_auth_info(certificate_identity) is None:
            certificate_identity = None  # a trusted certificate naming no user proves nobody: no EXTERNAL
        return SaslServer(self.mechanisms(tls, client_host, certificate_identity), self,
                          frame_max_bytes=self.config.sasl_frame_max_bytes,
                          allow_plain_amqp=self.database is None or self.config.allow_anonymous,
                          started_ms=now_ms, exchange_timeout_ms=self.config.handshake_timeout_ms,
                          external_identity=certificate_identity, held=held, defer_plain=defer_plain)

    # ---- the SASL server's authenticator -----------------------------------------------------

    def verify_plain(self, user: str, password: str) -> bool:
        return self.database is not None and self.database.verify_plain(user, password)

    def scram_auth_info(self, user: str):
        return self.database.scram_auth_info(user) if self.database is not None else None

    def scram_decoy(self, user: str):
        return self.database.scram_decoy(user) if self.database is not None else None

    # ---- reload ------------------------------------------------------------------------------

    def refresh(self) -> bool:
        """Read the users file again if it changed; True if the database in force changed."""
        current = stamp(self.users_path)
        if current == self._file_stamp:
            return False
        if current is None:
            if self.database is not None and self._bad_stamp != "gone":
                self._bad_stamp = "gone"
                log.error("%s is gone; the users read before stay in force until it is back", self.users_path)
            return False
        try:
            database = UserDatabase.load(self.users_path)
        except (GrouperError, OSError) as error:
            if self._bad_stamp != current:
                self._bad_stamp = current
                log.error("%s did not read (%s); the users read before stay in force", self.users_path, error)
            return False
        self._file_stamp, self._bad_stamp = current, None
        was_open = self.database is None
        self.database, self.access = database, database.access()
        if was_open:  # a file added beside a running open node (`grouper user add` after `grouper up`)
            log.warning("%s appeared: this node is now secured (%d users); new connections must log in%s",
                        self.users_path, len(database.users()),
                        ", anonymous ones get the database's anonymous roles" if self.config.allow_anonymous else "")
        else:
            log.info("users reloaded from %s: %d users", self.users_path, len(database.users()))
        return True


