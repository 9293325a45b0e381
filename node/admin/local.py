"""The admin API called in process: `AdminClient`'s methods, answered by this node's own `AdminServicer`.

Rules:
- For a caller inside the node that acts for someone else (the web console): it reaches the node only
  as a gRPC caller would, through the servicer, so identification, permissions, cluster spanning and
  error texts are the admin API's own, and the failed-login throttle sees the address of the one
  acted for (`source`), not this process's.
- No channel and no socket: each call runs the servicer method on the calling thread with a context
  that carries the caller's metadata and address; an abort becomes the `AdminError` a gRPC call's
  status would, from `client.ERROR_BY_STATUS`.
"""

from __future__ import annotations

import grpc

from node.admin.client import API_VERSION, API_VERSION_KEY, ERROR_BY_STATUS, AdminClient, NodeFailure


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(details)
        self.code = code
        self.details = details


class _Context:
    """What AdminServicer reads of a grpc.ServicerContext."""

    def __init__(self, metadata: tuple, source: str):
        self._metadata = metadata
        # grpc's form of context.peer(), which node.peer.service.source_host reads
        self._peer = "" if not source else f"ipv6:[{source}]:0" if ":" in source else f"ipv4:{source}:0"

    def invocation_metadata(self):
        return self._metadata

    def auth_context(self):
        return {}  # no TLS client certificate: a console caller is known by its password

    def peer(self) -> str:
        return self._peer

    def abort(self, code: grpc.StatusCode, details: str):
        raise _Aborted(code, details)


class _Stub:
    """`AdminClient._stub`: each RPC name is the servicer's method, called with a fresh context."""

    def __init__(self, servicer, source: str):
        self._servicer = servicer
        self._source = source

    def __getattr__(self, name: str):
        method = getattr(self._servicer, name)

        def call(request, timeout=None, metadata=()):
            return method(request, _Context(tuple(metadata), self._source))
        return call


class LocalAdmin(AdminClient):
    def __init__(self, servicer, source: str, metadata: tuple[tuple[str, str], ...] = ()):
        """`servicer`: this node's AdminServicer; `source`: the address of the one acted for;
        `metadata`: its credentials (node.admin.callers.Caller.forwarded)."""
        self.address = "this node"
        self.timeout_ms = 0  # the servicer's own deadlines apply (admin_timeout_ms, member calls)
        self._metadata = tuple(metadata) + ((API_VERSION_KEY, str(API_VERSION)),)
        self._stub = _Stub(servicer, source)

    def close(self) -> None:
        pass

    def _call(self, method, request):
        try:
            return method(request, metadata=self._metadata)
        except _Aborted as aborted:
            raise ERROR_BY_STATUS.get(aborted.code, NodeFailure)(self.address, aborted.code.name,
                                                                 aborted.details) from None
