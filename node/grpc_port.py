"""Binding a gRPC server to host:port, for the admin API and the peer listener alike.

Rules: IPv6 hosts are bracketed; a port that cannot be bound is a GrouperError saying what to do (the
server is stopped first), whichever way grpcio reports it (0, or RuntimeError in newer releases).
"""

from __future__ import annotations

from node.core.errors import GrouperError


def bind(server, host: str, port: int, credentials, refusal: str) -> int:
    """The port `server` listens on at `host` (TLS with `credentials`, plaintext when None); `refusal`
    is the error's text, with `{address}` for the address tried."""
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound_port = (server.add_insecure_port(address) if credentials is None
                      else server.add_secure_port(address, credentials))
    except RuntimeError:  # newer grpcio raises instead of returning 0
        bound_port = 0
    if bound_port == 0:
        server.stop(None)
        raise GrouperError(refusal.format(address=address))
    return bound_port
