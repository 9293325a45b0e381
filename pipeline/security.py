"""Who the pipeline's client is to a secured node, and how it talks to it: SASL credentials and TLS.

Rules:
- `Security` holds names only: a user, the path of a password file or the name of an environment
  variable, and certificate paths. Never a password: options travel in Spark's plans and in the
  pickled tasks, and a password there would reach logs and the UI. Each task reads the password
  where it runs (`password`), so the file (a mounted Kubernetes Secret, say) or the variable must
  be there on the driver and on the executors alike, and a rotated Secret reaches the next task.
- One mechanism per connection, chosen here: PLAIN with a user, else EXTERNAL with a client
  certificate, else ANONYMOUS. proton's client speaks no SCRAM-SHA-256.
- A password is never sent unencrypted off this host: PLAIN without TLS only to a loopback node.
- Failures raise `CredentialError` naming the option at fault and what to write instead; the
  options parser turns them into OptionError, the client into ClientError.
- No sockets here; files and the environment are read only when asked.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass

from node.net import is_loopback

PASSWORD_FILE_MAX_BYTES = 4096  # a longer "password file" is the wrong file
PLAIN, EXTERNAL, ANONYMOUS = "PLAIN", "EXTERNAL", "ANONYMOUS"


class CredentialError(ValueError):
    """`option` (its lower-case key) cannot be used; `problem` says why and what to do."""

    def __init__(self, option: str, problem: str):
        super().__init__(problem)
        self.option = option
        self.problem = problem


@dataclass(frozen=True)
class Security:
    user: str = ""  # "" = no user: EXTERNAL with a client certificate, else ANONYMOUS
    password_file: str = ""  # a path; its content is the password, one trailing newline dropped
    password_env: str = ""  # the name of an environment variable holding the password
    tls: bool = False  # speak TLS (the node's amqps port)
    ca_file: str = ""  # PEM CAs the node's certificate must chain to; "" = the system's CAs
    cert_file: str = ""  # PEM client certificate (its subject CN is the user for EXTERNAL)
    key_file: str = ""  # the client certificate's PEM key

    @property
    def mechanism(self) -> str:
        if self.user:
            return PLAIN
        if self.cert_file:
            return EXTERNAL
        return ANONYMOUS

    def describe(self) -> str:
        """Who this client claims to be, for error messages (never a secret)."""
        if self.user:
            return f"user {self.user!r} (PLAIN)"
        if self.cert_file:
            return f"the client certificate {self.cert_file} (EXTERNAL)"
        return "no credentials (ANONYMOUS)"


NO_SECURITY = Security()


def check_combination(security: Security, hosts) -> None:
    """The checks that read nothing: which options need which, and PLAIN's need for TLS off this host."""
    sources = [key for key, value in (("passwordfile", security.password_file),
                                      ("passwordenv", security.password_env)) if value]
    if len(sources) > 1:
        raise CredentialError("passwordenv", "give the password one way: passwordFile (a path) or passwordEnv "
                                             "(a variable's name), not both")
    if security.user and not sources:
        raise CredentialError("user", f"user {security.user!r} needs its password: passwordFile (a path, e.g. a "
                                      f"mounted Kubernetes Secret) or passwordEnv (an environment variable's name)")
    if sources and not security.user:
        raise CredentialError(sources[0], "a password needs a user: add option 'user'")
    if bool(security.cert_file) != bool(security.key_file):
        given, missing = ("certfile", "keyFile") if security.cert_file else ("keyfile", "certFile")
        raise CredentialError(given, f"a client certificate needs both certFile and keyFile; add {missing}")
    if (security.ca_file or security.cert_file) and not security.tls:
        raise CredentialError("tls", "caFile and certFile are for TLS; leave tls out (it then defaults to true) "
                                     "or set it to true")
    if security.user and not security.tls:
        remote = sorted({host for host in hosts if not is_loopback(host)})
        if remote:
            raise CredentialError("user", f"PLAIN would send the password of user {security.user!r} unencrypted to "
                                          f"{', '.join(remote)}; set tls to true and name the nodes' amqps ports "
                                          f"(caFile: the CA that signed their certificates)")


def check_files(security: Security) -> None:
    """Read what the options name, so that a wrong path fails once, on the driver, naming the option."""
    if security.user:
        password(security)
    if security.tls:
        tls_context(security)


def password(security: Security, environ=None) -> str:
    if security.password_file:
        path = security.password_file
        try:
            with open(path, "rb") as handle:
                data = handle.read(PASSWORD_FILE_MAX_BYTES + 1)
        except OSError as error:
            raise CredentialError("passwordfile", f"cannot read {path}: {error.strerror or error}; give the path "
                                                  f"of a file holding the password (a mounted Secret's key)") from None
        if len(data) > PASSWORD_FILE_MAX_BYTES:
            raise CredentialError("passwordfile", f"{path} is over {PASSWORD_FILE_MAX_BYTES} bytes: not a password "
                                                  f"file")
        try:
            text = _strip_one_newline(data.decode("utf-8"))
        except UnicodeDecodeError:
            raise CredentialError("passwordfile", f"{path} is not UTF-8 text") from None
        if not text:
            raise CredentialError("passwordfile", f"{path} is empty")
        return text
    if security.password_env:
        name = security.password_env
        text = (os.environ if environ is None else environ).get(name, "")
        if not text:
            raise CredentialError("passwordenv", f"the environment variable {name} is not set or empty here; set it "
                                                 f"on the driver and the executors (spark.executorEnv.{name}, or a "
                                                 f"Secret's key in the pods' env)")
        return text
    return ""


def tls_context(security: Security) -> ssl.SSLContext:
    """A client context: TLS 1.2 or later, the node's certificate checked against caFile (or the
    system's CAs) and against the host the client dials; the client certificate if given."""
    try:
        context = ssl.create_default_context(cafile=security.ca_file or None)
    except (OSError, ssl.SSLError) as error:
        raise CredentialError("cafile", f"cannot load CA certificates from {security.ca_file}: "
                                        f"{getattr(error, 'strerror', None) or error}; give a PEM file of the CA "
                                        f"that signed the nodes' certificates") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if security.cert_file:
        try:
            context.load_cert_chain(security.cert_file, security.key_file)
        except (OSError, ssl.SSLError) as error:
            raise CredentialError("certfile", f"cannot load the client certificate {security.cert_file} with key "
                                              f"{security.key_file}: {getattr(error, 'strerror', None) or error}; "
                                              f"give a PEM certificate and its PEM key (unencrypted)") from None
    return context


def _strip_one_newline(text: str) -> str:
    for ending in ("\r\n", "\n"):
        if text.endswith(ending):
            return text[:-len(ending)]
    return text
