"""Network names as the node's policies read them: is a host this machine's loopback?

Rules:
- One answer for the whole project: the node's security policy, its file modes and /metrics, the
  cluster's TLS rules, `grouper` commands, the lean client, bench/ and the pipeline all ask here.
- Loopback means a literal loopback address (127.0.0.0/8, ::1, also in brackets or with an IPv6 zone
  id) or the name `localhost`. No other name counts and nothing is resolved: the answer guards
  passwords, and a name that resolves to 127.0.0.1 on this host may not on the next.
- A leaf: the standard library only, no sockets, no I/O.
"""

from __future__ import annotations

import ipaddress


def is_loopback(host: str | None) -> bool:
    """True for a literal loopback address or `localhost`; False for anything else, garbage included."""
    if not host:
        return False
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return False


def is_loopback_address(address: str) -> bool:
    """`is_loopback` of the host of `host:port` (an IPv6 host in brackets: `[::1]:5673`)."""
    return is_loopback(address.rpartition(":")[0])
