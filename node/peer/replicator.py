"""Replicating to one backup node: a thread and a gRPC channel that make the Replicate calls the owner's
replica streams hand out (issue 28, docs/replication.md).

Rules:
- The decisions are node/core/replication/streams.py's (pure, on the engine loop): which entries a call
  carries, the reset flag, the backoff after a failure, when the backup lags. This module makes the one
  call in flight it is handed (`start`) and tells `on_answer(backup, call, high_water or None, reason)`
  its outcome. on_answer runs on the replicator thread, so it must only post to the engine loop (the
  bridge), never touch its state.
- The forwarder's shape (node/peer/forwarder.py): one thread per destination that waits on a condition
  (never spins), a channel made again when the backup's address or the TLS files change, mutual TLS
  with this node's certificate or, without it, the replication credential (node/peer/signature.py
  REPLICATION) on every call. `close` wakes the thread and closes the channel, which cancels the call
  in flight, so it returns promptly even when the backup hangs.
- Any failure is logged once when replication to the backup stops and once when it resumes, never per
  attempt.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Callable

from node.peer.peer_channel import ChannelClosed, PeerChannel, call_failure
from node.peer.replica_batch import batch_to_pb

log = logging.getLogger(__name__)


class Replicator:
    def __init__(self, owner: str, backup: str, resolve_address: Callable[[], str | None],
                 on_answer: Callable, *, call_timeout_ms: int, tls=None, signer=None):
        self.owner, self.backup = owner, backup
        self._resolve_address = resolve_address
        self._on_answer = on_answer
        self._call_timeout_s = call_timeout_ms / 1000
        self._signer = signer  # node.peer.signature.Signer(kind=REPLICATION), or None: with `tls`
        self._condition = threading.Condition()
        self._due = None  # (call, reset) handed over and not yet taken by the thread
        self._closed = False
        self._peer = PeerChannel(self._condition, tls)  # its channel: made by the thread, closed by either
        self._failing = False
        self._thread = threading.Thread(target=self._run, name=f"replicate-{backup}", daemon=True)
        self._thread.start()

    def start(self, call, reset: bool) -> None:
        """Engine loop: make `call` (the streams keep one in flight per backup)."""
        with self._condition:
            self._due = (call, reset)
            self._condition.notify()

    def close(self, timeout_s: float = 2.0) -> None:
        with self._condition:
            self._closed = True
            channel = self._peer.close_locked()
            self._condition.notify_all()
        if channel is not None:
            channel.close()
        self._thread.join(timeout_s)

    def _run(self) -> None:
        try:
            while True:
                with self._condition:
                    while self._due is None and not self._closed:
                        self._condition.wait()
                    if self._closed:
                        return
                    (call, reset), self._due = self._due, None
                try:
                    high_water, reason = self._attempt(call, reset), ""
                except _Failed as failure:
                    high_water, reason = None, failure.reason
                if self._is_closed():
                    return
                self._log(reason)
                self._on_answer(self.backup, call, high_water, reason)
        except BaseException:
            # a bug: an owner that silently stops replicating would hold its producers' accepts for ever
            log.critical("the replicator to %s stopped on a bug; stopping the node", self.backup, exc_info=True)
            os._exit(70)
        finally:
            self._peer.close_channel()

    def _is_closed(self) -> bool:
        with self._condition:
            return self._closed

    def _attempt(self, call, reset: bool) -> int:
        stub = self._stub_now()
        request = batch_to_pb(self.owner, call.epoch, [(entry.repl_seq, entry.queue, entry.group_id, entry.frame)
                                                       for entry in call.entries], reset)
        metadata = self._signer.metadata(request, self.backup) if self._signer is not None else None
        answer, failure = call_failure(stub.Replicate, request, self._call_timeout_s, metadata)
        if failure:
            raise _Failed(failure)
        return answer.high_water

    def _stub_now(self):
        address = self._resolve_address()
        if not address:
            raise _Failed("address unknown")
        try:
            return self._peer.stub_for(address)
        except ChannelClosed:
            raise _Failed("closed") from None

    def _log(self, reason: str) -> None:
        if reason and not self._failing:
            log.warning("replication from %s to backup %s (%s) stopped: %s; retrying with backoff", self.owner,
                        self.backup, self._peer.address or "address unknown", reason)
        elif not reason and self._failing:
            log.info("replication from %s to backup %s resumed", self.owner, self.backup)
        self._failing = bool(reason)


class _Failed(Exception):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Replicators:
    """One Replicator per backup, made on first use; engine loop thread (`close` at shutdown)."""

    def __init__(self, owner: str, resolve_address: Callable[[str], str | None], on_answer: Callable, *,
                 call_timeout_ms: int, tls=None):
        self.owner = owner
        self.signer = None  # without `tls`: node.peer.signature.Signer(secrets, REPLICATION); set before use
        self._resolve_address = resolve_address
        self._on_answer = on_answer
        self._call_timeout_ms = call_timeout_ms
        self._tls = tls
        self._replicators: dict[str, Replicator] = {}

    def to(self, backup: str) -> Replicator:
        replicator = self._replicators.get(backup)
        if replicator is None:
            resolve = self._resolve_address
            replicator = self._replicators[backup] = Replicator(
                self.owner, backup, lambda: resolve(backup), self._on_answer, call_timeout_ms=self._call_timeout_ms,
                tls=self._tls, signer=self.signer)
        return replicator

    def close(self) -> None:
        for replicator in self._replicators.values():
            replicator.close()
