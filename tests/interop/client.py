"""What every interop client offers a scenario: links by name, credit, sends, settlements, detaches.

A scenario (tests/interop/test_grouped_scenarios.py) is written once against `Client` and runs over
each real client: python-qpid-proton's container and blocking APIs (proton_clients.py) and rhea
(rhea_client.py). Rules:
- A driver only carries out commands and records what its client saw, as plain event dicts (the
  same shape rhea's script prints as JSON lines); every verb here reads those events. So what a test
  asserts is what the client library itself reported, never a guess.
- Every wait is bounded by WAIT_S and fails naming what it waited for and every event seen so far.
- One client is one AMQP connection, and a scenario keeps its consumers and producers on it: the
  node handles one connection's frames in the order they were sent, so "the consumer granted credit,
  then the producer sent" holds at the node too, without a sleep or a second round trip.

Events (`"event"` key): attached {link, role, source, target} (a terminus is null or {address,
distribution_mode}); detached {link, closed, condition, description}; message {link, delivery, body,
group, delivery_count, first_acquirer}; outcome {link, delivery, state, condition} (a send, settled by
the node); settled {link, delivery} (a consumer's outcome, settled by the node); drained {link,
credit}; error {text} (a driver failed to carry out a command; rhea adds the condition of a refused
connection); opened {} (rhea only: the node let the connection in).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Callable

WAIT_S = 10.0  # bound of every wait for an attach, a delivery, an outcome, a drain or a detach


@dataclass(frozen=True)
class Received:
    link: str
    delivery: int  # the client's own number for the delivery, to settle it by
    body: object
    group: str | None
    delivery_count: int
    first_acquirer: bool


@dataclass(frozen=True)
class Attached:
    """The node's attach as the client saw it; a null terminus is None."""
    link: str
    source: dict | None
    target: dict | None


@dataclass(frozen=True)
class Detached:
    """The node's detach as the client saw it."""
    link: str
    closed: bool
    condition: str | None
    description: str | None


@dataclass(frozen=True)
class Drained:
    messages: list  # Received, in arrival order, before the node's drained flow
    credit: int  # the link's credit once the node's drained flow arrived


class Client:
    """Verbs over a driver's `_command` and its recorded events."""

    label = "client"

    def __init__(self):
        self.events: list[dict] = []
        self._changed = threading.Condition()
        self._taken: set[tuple[str, int]] = set()  # (link, delivery) handed to the test already

    # ---- what a driver provides ----------------------------------------------------------------

    def _command(self, op: str, **fields) -> None:
        """Carry out one command in the client (its own thread, process or the caller's)."""
        raise NotImplementedError

    def _pump(self, seen_count: int, timeout_s: float) -> None:
        """Return once more than `seen_count` events are recorded, or after `timeout_s`.

        Threaded drivers record from their own thread, so this only waits; a driver whose client
        runs in the caller's thread makes it progress here."""
        with self._changed:
            self._changed.wait_for(lambda: len(self.events) != seen_count, timeout_s)

    def close(self) -> None:
        raise NotImplementedError

    def record(self, event: dict) -> None:
        with self._changed:
            self.events.append(event)
            self._changed.notify_all()

    # ---- waiting -----------------------------------------------------------------------------

    def wait_for(self, found: Callable[[list], object], what: str, timeout_s: float = WAIT_S):
        """Return `found(events)` once it is not None; fail after `timeout_s` naming `what`."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._changed:
                events = list(self.events)
            errors = [event for event in events if event["event"] == "error"]
            assert not errors, f"{self.label} failed a command: {errors}"
            result = found(events)
            if result is not None:
                return result
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                raise AssertionError(f"{self.label}: no {what} within {timeout_s} s; events seen:\n"
                                     + "\n".join(map(str, events)))
            self._pump(len(events), left_s)

    def _last(self, kind: str, link: str):
        def found(events):
            matching = [event for event in events if event["event"] == kind and event["link"] == link]
            return matching[-1] if matching else None
        return found

    # ---- verbs -------------------------------------------------------------------------------

    def open_receiver(self, link: str, address: str, *, browse: bool = False) -> Attached:
        """Attach a consumer (a browser with `browse`) with no credit; returns the node's attach."""
        self._command("receiver", link=link, address=address, browse=browse)
        return self._attached(link)

    def open_sender(self, link: str, address: str | None) -> Attached:
        """Attach a producer; `address=None` is the anonymous relay (no target address)."""
        self._command("sender", link=link, address=address)
        return self._attached(link)

    def _attached(self, link: str) -> Attached:
        event = self.wait_for(self._last("attached", link), f"attach from the node for {link}")
        return Attached(link, event["source"], event["target"])

    def send(self, link: str, messages: list[dict]) -> list[tuple[str, str | None]]:
        """Send messages ({body, group, to}) and wait for the node to settle each: (state, condition)."""
        with self._changed:
            before = len([e for e in self.events if e["event"] == "outcome" and e["link"] == link])
        self._command("send", link=link, messages=messages)

        def found(events):
            outcomes = [e for e in events if e["event"] == "outcome" and e["link"] == link][before:]
            if len(outcomes) < len(messages):
                return None
            # in send order: the node refuses a message at once but accepts at the end of its batch
            return [(e["state"], e["condition"]) for e in sorted(outcomes, key=lambda e: e["delivery"])]
        return self.wait_for(found, f"outcomes of {len(messages)} sends on {link}")

    def flow(self, link: str, credit: int) -> None:
        self._command("flow", link=link, credit=credit)

    def receive(self, link: str, count: int) -> list[Received]:
        """The next `count` deliveries on `link` (credit is the test's to grant)."""
        def found(events):
            fresh = self._fresh(events, link)
            return fresh[:count] if len(fresh) >= count else None
        taken = self.wait_for(found, f"{count} deliveries on {link}")
        self._taken.update((link, held.delivery) for held in taken)
        return taken

    def arrived(self, link: str) -> list[Received]:
        """Deliveries on `link` not yet handed to the test, without waiting."""
        with self._changed:
            events = list(self.events)
        return self._fresh(events, link)

    def _fresh(self, events: list, link: str) -> list[Received]:
        return [Received(e["link"], e["delivery"], e["body"], e["group"], e["delivery_count"], e["first_acquirer"])
                for e in events
                if e["event"] == "message" and e["link"] == link and (link, e["delivery"]) not in self._taken]

    def drain(self, link: str, credit: int) -> Drained:
        """Grant `credit` in drain mode; returns what arrived before the node's drained flow."""
        before = len(self.events)
        self._command("drain", link=link, credit=credit)

        def found(events):
            for index in range(before, len(events)):
                event = events[index]
                if event["event"] == "drained" and event["link"] == link:
                    return index, event["credit"]
            return None
        index, credit_left = self.wait_for(found, f"the node's drained flow on {link}")
        with self._changed:
            messages = self._fresh(self.events[:index], link)
        self._taken.update((link, held.delivery) for held in messages)
        return Drained(messages, credit_left)

    def settle(self, held: Received, outcome: str) -> None:
        """accept, release, modify (delivery-failed) or reject a delivery; returns once the node settled it.

        The outcome goes out unsettled and the client settles when the node has: a client library
        writes its pending flows before its dispositions, so without this round trip a later grant of
        credit could reach the node before the release it follows."""
        self._command("settle", link=held.link, delivery=held.delivery, outcome=outcome)
        self.wait_for(lambda events: next((e for e in events if e["event"] == "settled" and e["link"] == held.link
                                           and e["delivery"] == held.delivery), None),
                      f"the node settling {held.body!r} on {held.link}")

    def detach(self, link: str, *, closed: bool) -> Detached:
        """Detach `link` (closed or, with closed=False, suspended); returns the node's answering detach."""
        self._command("detach", link=link, closed=closed)
        return self.wait_detached(link)

    def wait_detached(self, link: str) -> Detached:
        event = self.wait_for(self._last("detached", link), f"detach from the node for {link}")
        return Detached(link, event["closed"], event["condition"], event["description"])
