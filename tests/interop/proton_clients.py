"""python-qpid-proton as an interop client, twice: the container API (a reactor in its own thread)
and BlockingConnection (the caller's thread pumps it).

Both drive the same proton link objects through one MessagingHandler (`_Recorder`) that records
what proton reported as client.py's event dicts; they differ only in who owns the reactor. Rules:
- Container: the reactor thread owns every proton object; the test thread only queues a call and
  wakes the reactor through an EventInjector. Nothing here touches a link from the test thread.
- Blocking: everything runs in the test thread; waiting is BlockingConnection.wait with a bound.
- The handler grants no credit of its own (prefetch 0) and accepts nothing by itself: credit and
  outcomes are the scenario's to give.
"""

from __future__ import annotations

import collections
import threading

from proton import Delivery, Message, Terminus, Timeout
from proton.handlers import MessagingHandler
from proton.reactor import ApplicationEvent, Container, Copy, EventInjector
from proton.utils import BlockingConnection, LinkDetached

from tests.interop.client import WAIT_S, Client

OUTCOME_STATES = {"accept": Delivery.ACCEPTED, "release": Delivery.RELEASED, "modify": Delivery.MODIFIED,
                  "reject": Delivery.REJECTED}
STATE_NAMES = {Delivery.ACCEPTED: "accepted", Delivery.REJECTED: "rejected", Delivery.RELEASED: "released",
               Delivery.MODIFIED: "modified"}
DISTRIBUTION_MODES = {Terminus.DIST_MODE_COPY: "copy", Terminus.DIST_MODE_MOVE: "move"}


def _terminus(terminus: Terminus) -> dict | None:
    if terminus.type == Terminus.UNSPECIFIED:  # what proton makes of a null source or target
        return None
    return {"address": terminus.address, "distribution_mode": DISTRIBUTION_MODES.get(terminus.distribution_mode)}


def _condition(link) -> tuple[str | None, str | None]:
    condition = link.remote_condition
    return (condition.name, condition.description) if condition is not None else (None, None)


class _Recorder(MessagingHandler):
    """Proton's events on our links, recorded; the link and delivery tables the commands use."""

    def __init__(self, client: Client):
        super().__init__(prefetch=0, auto_accept=False, auto_settle=True)
        self.client = client
        self.links: dict[str, object] = {}
        self.deliveries: dict[tuple[str, int], Delivery] = {}  # consumer side, until settled
        self.settling: dict[Delivery, int] = {}  # consumer side: outcome sent, the node's settlement awaited
        self.sent: dict[Delivery, int] = {}  # producer side: delivery -> index in send order
        self.counts: collections.Counter = collections.Counter()  # deliveries per link, either side

    def _next(self, link_name: str) -> int:
        self.counts[link_name] += 1
        return self.counts[link_name]

    def on_link_remote_open(self, event):
        link = event.link
        self.client.record({"event": "attached", "link": link.name, "role": "sender" if link.is_sender else "receiver",
                            "source": _terminus(link.remote_source), "target": _terminus(link.remote_target)})

    def on_link_remote_close(self, event):
        self._detached(event.link, closed=True)

    def on_link_remote_detach(self, event):
        self._detached(event.link, closed=False)

    def _detached(self, link, closed: bool) -> None:
        name, description = _condition(link)
        self.client.record({"event": "detached", "link": link.name, "closed": closed, "condition": name,
                            "description": description})

    def on_link_error(self, event):
        pass  # recorded above; MessagingHandler's default would close the whole connection

    def on_message(self, event):
        link, message = event.link, event.message
        index = self._next(link.name)
        self.deliveries[(link.name, index)] = event.delivery
        self.client.record({"event": "message", "link": link.name, "delivery": index, "body": message.body,
                            "group": message.group_id, "delivery_count": message.delivery_count,
                            "first_acquirer": bool(message.first_acquirer)})

    def on_settled(self, event):
        delivery = event.delivery
        if delivery.link.is_receiver:
            if delivery in self.settling:
                self.client.record({"event": "settled", "link": delivery.link.name,
                                    "delivery": self.settling.pop(delivery)})
                delivery.settle()
            return
        if delivery not in self.sent:
            return
        condition = delivery.remote.condition
        self.client.record({"event": "outcome", "link": delivery.link.name, "delivery": self.sent.pop(delivery),
                            "state": STATE_NAMES.get(delivery.remote_state, str(delivery.remote_state)),
                            "condition": condition.name if condition is not None else None})

    def on_link_flow(self, event):  # the handlers MessagingHandler delegates to see this event too
        link = event.link
        if link.is_receiver and link.drain_mode:  # only a flow from the node raises this event
            link.drain_mode = False
            self.client.record({"event": "drained", "link": link.name, "credit": link.credit})

    # ---- commands, run by whoever owns the reactor --------------------------------------------

    def send(self, link: str, messages: list[dict]) -> None:
        sender = self.links[link]
        for fields in messages:
            message = Message(body=fields["body"], address=fields.get("to"))
            if fields.get("group") is not None:
                message.group_id = fields["group"]
            self.sent[sender.send(message)] = self._next(link)

    def flow(self, link: str, credit: int) -> None:
        receiver = self.links[link]
        receiver.drain_mode = False
        receiver.flow(credit)

    def drain(self, link: str, credit: int) -> None:
        self.links[link].drain(credit)

    def settle(self, link: str, delivery: int, outcome: str) -> None:
        held = self.deliveries.pop((link, delivery))
        if outcome == "modify":
            held.local.failed = True
        held.update(OUTCOME_STATES[outcome])  # settled once the node has settled it (on_settled)
        self.settling[held] = delivery

    def detach(self, link: str, closed: bool) -> None:
        if closed:
            self.links[link].close()
        else:
            self.links[link].detach()


class ContainerClient(Client):
    """proton.reactor.Container running in a thread, commanded through an EventInjector."""

    label = "proton container"

    def __init__(self, url: str):
        super().__init__()
        self._recorder = _Recorder(self)
        self._calls: collections.deque = collections.deque()
        self._injector = EventInjector()
        self._container = Container(self._recorder)
        self._container.selectable(self._injector)
        self._connection = self._container.connect(url, handler=self._recorder)
        self._recorder.on_interop_call = self._run_calls  # the injected event's handler method
        self._thread = threading.Thread(target=self._run, name="proton-container", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._container.run()
        except Exception as error:  # a handler raised: the reactor stopped, and the waiting test says why
            self.record({"event": "error", "text": f"the reactor stopped: {type(error).__name__}: {error}"})

    def _run_calls(self, event) -> None:
        while self._calls:
            call = self._calls.popleft()
            try:
                call()
            except Exception as error:  # reported to the waiting test, which fails naming it
                self.record({"event": "error", "text": f"{type(error).__name__}: {error}"})

    def _call(self, call) -> None:
        self._calls.append(call)
        self._injector.trigger(ApplicationEvent("interop_call"))

    def _command(self, op: str, **fields) -> None:
        recorder = self._recorder
        if op == "receiver":
            def call():
                options = [Copy()] if fields["browse"] else None
                recorder.links[fields["link"]] = self._container.create_receiver(
                    self._connection, fields["address"], name=fields["link"], handler=recorder, options=options)
        elif op == "sender":
            def call():
                recorder.links[fields["link"]] = self._container.create_sender(
                    self._connection, fields["address"], name=fields["link"], handler=recorder)
        else:
            def call():
                getattr(recorder, op)(**fields)
        self._call(call)

    def close(self) -> None:
        def call():
            self._connection.close()
            self._injector.close()
        self._call(call)
        self._thread.join(WAIT_S)
        if self._thread.is_alive():
            self._call(self._container.stop)
            self._thread.join(WAIT_S)
        assert not self._thread.is_alive(), "the proton container did not stop"


class BlockingClient(Client):
    """proton.utils.BlockingConnection: links open and wait in the test's own thread."""

    label = "proton blocking"

    def __init__(self, url: str):
        super().__init__()
        self._recorder = _Recorder(self)
        self._connection = BlockingConnection(url, timeout=WAIT_S)
        self._opened: list = []  # a BlockingSender or BlockingReceiver unhooks our handler when collected

    def _pump(self, seen_count: int, timeout_s: float) -> None:
        try:
            self._connection.wait(lambda: len(self.events) != seen_count, timeout=timeout_s, msg="client events")
        except Timeout:
            pass

    def _command(self, op: str, **fields) -> None:
        recorder = self._recorder
        try:
            if op == "receiver":
                options = [Copy()] if fields["browse"] else None
                opened = self._connection.create_receiver(fields["address"], credit=0, name=fields["link"],
                                                          handler=recorder, options=options)
                recorder.links[fields["link"]] = opened.link
                self._opened.append(opened)
            elif op == "sender":
                opened = self._connection.create_sender(fields["address"], name=fields["link"], handler=recorder)
                recorder.links[fields["link"]] = opened.link
                self._opened.append(opened)
            else:
                getattr(recorder, op)(**fields)
        except LinkDetached as refused:  # the node answered the attach with a detach: recorded as events
            recorder.links[fields["link"]] = refused.link

    def close(self) -> None:
        self._connection.close()
