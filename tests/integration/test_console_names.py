"""The web console acts on the group and queue it names, whatever their names: in chromium (Debian's
chromium and chromium-driver, as tests/integration/test_console.py), against one open node.

A browser resolves `.` and `..` path segments (and their encoded forms `%2e`, `%2e%2e`) before it
sends a request, so a name carried in a URL path can point an action elsewhere: issue 26 found
Purge on a group named `..` purging its whole queue. These tests plant such names and check that
each action reached exactly its target and nothing else.

Rules of this file: one node and one browser for the module; every wait is bounded and polls the page
or the admin API; nothing asserts an upper bound on time.
"""

from __future__ import annotations

import pytest
from proton.utils import BlockingConnection

from node.admin.client import AdminClient
from tests.integration.harness import WAIT_S, NodeProcess, grouped
from tests.integration.test_console import driver  # noqa: F401 (the module's one browser, a fixture)
from tests.integration.test_console import confirm, group_row, open_view, text_of, wait_page

QUEUE = "orders"
ODD_QUEUES = ("..", "a/b", "%2e%2e", ".")  # queue names a browser would read as path syntax if put in a path
ODD_GROUPS = ("..", ".", "%2e%2e", "%2E", "a/b", "../..")  # group ids of the same kind
KEPT_GROUPS = ("keep-1", "keep-2")  # ordinary groups beside them: an action on an odd one must leave them be
MESSAGES_PER_GROUP = 2


def queue_table(name: str) -> str:
    return f'[[queue]]\nname = "{name}"\n'


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    config = "\n".join(queue_table(name) for name in (QUEUE, *ODD_QUEUES))
    started = NodeProcess(tmp_path_factory.mktemp("names") / "node", config).start()
    try:
        yield started
    finally:
        started.kill()


def send(node, queue: str, groups) -> None:
    connection = BlockingConnection(node.url, timeout=WAIT_S)
    try:
        sender = connection.create_sender(queue)
        for group in groups:
            for index in range(MESSAGES_PER_GROUP):
                sender.send(grouped(f"{group}-{index}", group))
    finally:
        connection.close()


def depths(node, queue: str) -> dict:
    """{group: available messages} of `queue`, from the admin API (not the console)."""
    with AdminClient(node.admin_address) as admin:
        page = admin.group_page(queue, page_size=500)
    return {row["group"]: row["messages"] for row in page["groups"] if row["messages"]}


def queue_depths(node) -> dict:
    with AdminClient(node.admin_address) as admin:
        return {queue["name"]: queue["depth_messages"] for queue in admin.list_queues()}


def show_groups(chromium, node, queue: str) -> None:
    from selenium.webdriver.support.ui import Select

    chromium.get(f"http://{node.http_address}/")
    open_view(chromium, "groups")
    wait_page(chromium, lambda: queue in [option.get_attribute("value") for option in
                                          chromium.find_elements("css selector", "#groups-queue option")],
              f"queue {queue!r} to choose")
    Select(chromium.find_element("id", "groups-queue")).select_by_value(queue)
    chromium.find_element("id", "groups-search").click()
    wait_page(chromium, lambda: chromium.find_element("id", "groups").get_attribute("data-queue") == queue,
              f"the groups of queue {queue!r}")


def purge_group_in_page(chromium, queue: str, group: str) -> None:
    wait_page(chromium, lambda: group_row(chromium, group).find_element("class name", "purge").click() or True,
              f"group {group!r}'s Purge button")
    confirm(chromium, f"Purge group {group} of queue {queue}?")
    wait_page(chromium, lambda: text_of(chromium, "action-result").startswith(f"group {group}: "),
              f"the purge of group {group!r}")


def test_purge_on_a_group_named_dot_dot_purges_that_group_only(node, driver):
    send(node, QUEUE, (*ODD_GROUPS, *KEPT_GROUPS))
    assert depths(node, QUEUE) == {group: MESSAGES_PER_GROUP for group in (*ODD_GROUPS, *KEPT_GROUPS)}

    show_groups(driver, node, QUEUE)
    left = set(ODD_GROUPS) | set(KEPT_GROUPS)
    for group in ODD_GROUPS:  # `..` first: the one issue 26 found
        purge_group_in_page(driver, QUEUE, group)
        assert text_of(driver, "action-result") == f"group {group}: {MESSAGES_PER_GROUP} message(s) purged"
        left.discard(group)
        assert depths(node, QUEUE) == {kept: MESSAGES_PER_GROUP for kept in left}, f"after purging {group!r}"
    assert not driver.find_element("id", "error").is_displayed(), text_of(driver, "error")


def test_queues_named_like_path_syntax_are_listed_and_acted_on_alone(node, driver):
    for queue in ODD_QUEUES:
        send(node, queue, ("g1", ".."))
    before = queue_depths(node)
    assert all(before[queue] == 2 * MESSAGES_PER_GROUP for queue in ODD_QUEUES), before

    # a group of each odd queue: its page lists it and its Purge reaches it alone
    for queue in ODD_QUEUES:
        show_groups(driver, node, queue)
        wait_page(driver, lambda: group_row(driver, "g1") is not None and group_row(driver, "..") is not None,
                  f"the groups of queue {queue!r}")
        purge_group_in_page(driver, queue, "..")
        assert depths(node, queue) == {"g1": MESSAGES_PER_GROUP}, queue
    assert {name: depth for name, depth in queue_depths(node).items() if name not in ODD_QUEUES} \
        == {name: depth for name, depth in before.items() if name not in ODD_QUEUES}

    # the whole-queue Purge of each odd queue empties that queue and no other
    driver.get(f"http://{node.http_address}/")
    open_view(driver, "queues")
    for queue in ODD_QUEUES:
        expected = {**queue_depths(node), queue: 0}
        row = f'#queues tr[data-queue="{css_string(queue)}"]'
        wait_page(driver, lambda: driver.find_element("css selector", row).find_element("class name", "purge")
                  .click() or True, f"queue {queue!r}'s Purge button")
        confirm(driver, f"Purge queue {queue} ")
        wait_page(driver, lambda: text_of(driver, "queues-result") == f"queue {queue}: {MESSAGES_PER_GROUP} "
                                                                     f"message(s) purged", f"the purge of {queue!r}")
        assert queue_depths(node) == expected, queue
    assert not driver.find_element("id", "error").is_displayed(), text_of(driver, "error")


def css_string(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')
