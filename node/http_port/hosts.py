"""Which names the HTTP port answers to, and whose pages may act through it: the port's defence against
DNS rebinding and cross-site requests (issue 26).

Rules:
- Pure: no socket, no threading, no time. node.http_port.server passes each request's method and its Host and
  Origin headers; a refusal is (status, message), the message saying what to do.
- Host, on every request. A DNS rebinding page is served under the attacker's name, which then
  resolves to this node, so the browser sends that name as Host. A request is answered only when its
  Host names the node as it is known: an IP address (a browser sends one only for a URL naming that
  address, which no other site's page can have), a loopback name (LOOPBACK_NAMES), the node's host
  and advertise_host, the machine's host name, or a name in http_allowed_hosts ("*" lets any name in,
  for a proxy that checks Host itself). The port is not compared: port mappings (`-p 5685:5675`) and
  proxies change it, and a rebinding page may use any port anyway. A request without Host (HTTP/1.0)
  comes from no browser and is answered. Refused: 421 Misdirected Request.
- Origin, on every request that may change state (any method but SAFE_METHODS). A browser names the
  page a request comes from; it must be a page of this very scheme, host and port. "null" (a sandboxed
  frame, a file) is refused. Without Origin (not a browser) node.console's own rule stands: actions
  take only a JSON body, which no form of another site can send without a preflight this port never
  grants. Refused: 403 Forbidden.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
ANY_NAME = "*"  # in http_allowed_hosts: every name is answered
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})  # read-only: Origin is not asked of them
DEFAULT_PORTS = {"http": 80, "https": 443}
NAME_MAX_CHARS = 253  # a DNS name's longest text form
_NAME = re.compile(r"[a-z0-9_]([a-z0-9_.-]*[a-z0-9_])?")
_SETTING = "http_allowed_hosts (GROUPER_HTTP_ALLOWED_HOSTS, or [node] in the config file)"


@dataclass(frozen=True)
class Refusal:
    status: int  # 421 for a Host, 403 for an Origin
    message: str


def split_host(value: str) -> tuple[str, int | None] | None:
    """(name, port) of a Host header or an origin's authority: the name lower-cased, without a final
    dot, an IPv6 address without brackets; port None when absent. None: not a host at all."""
    value = value.strip().lower()
    if value.startswith("["):
        address, bracket, rest = value[1:].partition("]")
        if not bracket or _ip(address) is None:
            return None
        name = address
    else:
        name, colon, port = value.partition(":")
        rest = colon + port
        name = name[:-1] if name.endswith(".") else name
        if not name or len(name) > NAME_MAX_CHARS or not _NAME.fullmatch(name):
            return None
    if not rest:
        return name, None
    if not rest.startswith(":") or not rest[1:].isascii() or not rest[1:].isdigit() or not 0 < int(rest[1:]) < 65536:
        return None
    return name, int(rest[1:])


def parse_names(setting: str) -> tuple[str, ...]:
    """The names of http_allowed_hosts (comma-separated), or ValueError saying which one is no name."""
    names = []
    for entry in (part.strip() for part in setting.split(",")):
        if not entry:
            continue
        parsed = None if entry == ANY_NAME else split_host(entry)
        if entry != ANY_NAME and (parsed is None or parsed[1] is not None):
            raise ValueError(f"{entry[:80]!r} is not a host name (give names without a port or scheme, "
                             f"separated by commas, or * for any name)")
        names.append(ANY_NAME if entry == ANY_NAME else parsed[0])
    return tuple(names)


class HostPolicy:
    def __init__(self, names, scheme: str = "http"):
        """`names`: what the node is known by beyond IP addresses and loopback names (host, advertise_host,
        the machine's name, http_allowed_hosts); `scheme`: "http" or "https", what the port speaks."""
        self._names = frozenset(parsed[0] for parsed in (split_host(name) for name in names if name and
                                                         name != ANY_NAME) if parsed is not None) | LOOPBACK_NAMES
        self._any_name = ANY_NAME in names
        self._scheme = scheme

    def refusal(self, method: str, host: str | None, origin: str | None) -> Refusal | None:
        if host is not None and not self._any_name:
            parsed = split_host(host)
            if parsed is None or not self.knows(parsed[0]):
                return Refusal(421, f"this node does not answer to the name {host[:100]!r} (the request's Host): "
                                    f"a page reached by a name the operator did not list may be a DNS rebinding "
                                    f"attack. Use the node's address, localhost or a listed name, or have the "
                                    f"operator add the name to {_SETTING}")
        if method.upper() in SAFE_METHODS or origin is None:
            return None
        if host is None or not self._same_origin(origin, host):
            own = f"{self._scheme}://{host}/" if host else "the node's own address"
            return Refusal(403, f"a {method} from a page of Origin {origin[:100]!r} is refused: actions are taken "
                                f"only from the console's own page. Open the console at {own} and act there")
        return None

    def knows(self, name: str) -> bool:
        return name in self._names or _ip(name) is not None

    def _same_origin(self, origin: str, host: str) -> bool:
        scheme, separator, authority = origin.strip().lower().partition("://")
        if not separator or scheme != self._scheme:
            return False
        ours, theirs = split_host(host), split_host(authority)
        if ours is None or theirs is None:
            return False
        default = DEFAULT_PORTS[self._scheme]
        return (ours[0], ours[1] or default) == (theirs[0], theirs[1] or default)


def _ip(text: str):
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None
