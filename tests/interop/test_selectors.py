"""JMS selectors with rhea (JavaScript): its `filter.selector` names the filter by its numeric descriptor
(0x0000468C00000004), which the node applies and echoes as rhea sent it; a malformed selector is refused
with amqp:invalid-field naming where and what (docs/selectors.md)."""

from __future__ import annotations

from tests.interop.rhea_client import RheaClient

SELECTOR_FILTER_CODE = 0x0000468C00000004


def rhea_client(nodejs: str, node) -> RheaClient:
    host, port = node.amqp_address.rsplit(":", 1)
    return RheaClient(nodejs, host, int(port))


def attached_event(client: RheaClient, link: str) -> dict:
    return client.wait_for(lambda events: next((e for e in events if e["event"] == "attached" and e["link"] == link),
                                               None), f"the node's attach of {link}")


def test_a_rhea_consumer_with_a_selector_receives_only_green_and_sees_its_filter_echoed(node_factory, nodejs):
    client = rhea_client(nodejs, node_factory())
    try:
        client._command("receiver", link="green", address="colours", browse=False, selector="colour = 'green'")
        assert attached_event(client, "green")["filter"] == {
            "jms-selector": {"descriptor": str(SELECTOR_FILTER_CODE), "value": "colour = 'green'"}}
        client.open_sender("p", "colours")
        colours = ["red", "green", "blue", "green", "red"]
        client.send("p", [{"body": number, "group": None, "to": None, "properties": {"colour": colour}}
                          for number, colour in enumerate(colours)])
        client.flow("green", 10)
        assert [held.body for held in client.receive("green", 2)] == [1, 3]
        assert client.drain("green", 0).messages == []  # the red and blue ones are not offered to it
        client.open_receiver("all", "colours")
        client.flow("all", 10)
        assert [held.body for held in client.receive("all", 3)] == [0, 2, 4]  # kept for a consumer that takes them
    finally:
        client.close()


def test_a_rhea_consumer_with_a_malformed_selector_is_refused_with_the_position(node_factory, nodejs):
    client = rhea_client(nodejs, node_factory())
    try:
        client._command("receiver", link="bad", address="colours", browse=False, selector="colour = 'green")
        detached = client.wait_detached("bad")
        assert detached.condition == "amqp:invalid-field"
        assert detached.description == "selector: at 9, a string that is never closed: end it with '"
    finally:
        client.close()
