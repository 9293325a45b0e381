"""The console's second version in chromium (Debian's chromium and chromium-driver, as
tests/integration/test_console.py): the overview, the queues summed cluster-wide with rates while
messages flow, and the hot groups, against a 3-node cluster of real `grouper node` processes.

Rules of this file: one cluster and one browser for the module (the browser is test_console's
fixture); traffic runs on a thread of its own with its own connection, stopped before the cluster;
every wait is bounded and polls the page or the API; nothing asserts an upper bound on time.
"""

from __future__ import annotations

import threading
import time

import pytest
from proton.utils import BlockingConnection

from tests.integration.cluster import Cluster
from tests.integration.harness import WAIT_S, grouped
from tests.integration.test_console import PASSWORD, api, check_screenshot, log_in, open_view, text_of, wait_page
from tests.integration.test_console import driver, users  # noqa: F401 (fixtures: the module's browser, users file)

FLOWING = "orders"  # a producer and a consumer keep messages moving through it
WAITING = "jobs"  # groups with a backlog and no consumer: the hot groups
# group -> messages waiting, sent in this order: arrival order is not backlog order
BACKLOGS = {"cool-d": 1, "hot-b": 8, "warm-c": 3, "hot-a": 12}
SEND_INTERVAL_S = 0.02  # the producer's pace: tens of messages a second
SAMPLE_SPACING_S = 1.2  # over the node's SAMPLE_SPACING_MIN_MS (1 s): its next answer records a sample


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, users):  # noqa: F811 (the users fixture)
    with pytest.MonkeyPatch.context() as environment:
        environment.setenv("GROUPER_USER", "admin")
        environment.setenv("GROUPER_PASSWORD", PASSWORD)
        # replication_factor 1: no backups asked for, so the overview has no under-replication alarm to
        # show (the alarms themselves: tests/unit/test_console_views.py)
        queues = "".join(f'[[queue]]\nname = "{name}"\nreplication_factor = 1\n\n' for name in (FLOWING, WAITING))
        nodes = Cluster(tmp_path_factory.mktemp("cluster"), config_text=queues,
                        args=("--users-file", str(users), "--sasl-plain-on-loopback"))
        try:
            nodes.start()
            yield nodes
        finally:
            nodes.kill_all()


class Traffic:
    """Sends to FLOWING and takes each message back, on its own thread, until stopped."""

    def __init__(self, node):
        self._node = node
        self._stop = threading.Event()
        self.moved = 0
        self.error: Exception | None = None
        self._thread = threading.Thread(target=self._run, name="traffic", daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc_info):
        self._stop.set()
        self._thread.join(WAIT_S)

    def _run(self):
        try:
            connection = BlockingConnection(self._node.url, timeout=WAIT_S, user="admin", password=PASSWORD,
                                            allowed_mechs="PLAIN", allow_insecure_mechs=True)
            try:
                sender = connection.create_sender(FLOWING)
                receiver = connection.create_receiver(FLOWING, credit=10)
                while not self._stop.is_set():
                    sender.send(grouped(f"m{self.moved}", f"flow-{self.moved % 4}"))
                    receiver.receive(timeout=WAIT_S)
                    receiver.accept()
                    self.moved += 1
                    time.sleep(SEND_INTERVAL_S)
            finally:
                connection.close()
        except Exception as error:  # the test reports it
            self.error = error


def fill_backlogs(node) -> None:
    connection = BlockingConnection(node.url, timeout=WAIT_S, user="admin", password=PASSWORD,
                                    allowed_mechs="PLAIN", allow_insecure_mechs=True)
    try:
        sender = connection.create_sender(WAITING)
        for group, count in BACKLOGS.items():
            for index in range(count):
                sender.send(grouped(f"{group}-{index}", group))
    finally:
        connection.close()


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return -1.0  # "", "-": no rate shown


def test_overview_queues_and_hot_groups_show_the_cluster_as_one(cluster, driver, tmp_path):  # noqa: F811
    first = cluster.nodes[0]
    fill_backlogs(first)
    with Traffic(first) as traffic:
        wait_page(driver, lambda: traffic.moved >= 20 or traffic.error, "traffic flowing")
        assert traffic.error is None, traffic.error
        # someone looked at the queues a moment ago: the node sampled the counters then
        assert api(first, "/api/queues", "admin", PASSWORD)[0] == 200
        time.sleep(SAMPLE_SPACING_S)

        log_in(driver, first, "admin", PASSWORD)
        open_view(driver, "queues")
        row = f'#queues tr[data-queue="{FLOWING}"]'
        wait_page(driver, lambda: driver.find_elements("css selector", row), "the flowing queue")
        # the page's first draw already shows the rate: the first console computed it between two of the
        # page's own polls, so a freshly opened page showed In /s and Out /s empty
        first_draw = [cell_under(driver, "queues", row, header) for header in ("In /s", "Out /s")]
        assert all(number(text) > 0 for text in first_draw), f"In /s, Out /s on the page's first draw: {first_draw}"
        assert len(driver.find_elements("css selector", "#queues tbody tr[data-queue]")) == 2  # one row a queue
        driver.find_element("css selector", f"{row} button.per-node").click()
        wait_page(driver, lambda: len(driver.find_elements("css selector", "#queues tr.node-share")) == 3,
                  "the queue's share on each of the 3 nodes")

        open_view(driver, "overview")
        leader = cluster.status()["leader"]
        wait_page(driver, lambda: text_of(driver, "overview-leader").endswith(f"(raft {leader})"), "the leader")
        wait_page(driver, lambda: text_of(driver, "health") == "healthy", "a healthy cluster")
        assert text_of(driver, "alarms") == "none: every node answers and is ready"
        assert text_of(driver, "overview-nodes").startswith("3 of 3 ready")
        wait_page(driver, lambda: number(driver.find_element(
            "css selector", f'#overview-queues tr[data-queue="{FLOWING}"] td.rate-in').text) > 0, "a rate in")
        wait_page(driver, lambda: len(driver.find_elements("css selector", "#rate-chart circle.dot-in_per_s")) >= 3,
                  "the rate chart with 3 samples")  # the page redraws every 3 s; each answer may add one
        assert text_of(driver, "overview-rates").startswith("in ") and "/s, out " in text_of(driver, "overview-rates")
        check_screenshot(driver.get_screenshot_as_png(), tmp_path / "overview.png", viewport(driver),
                         ("Overview", "healthy", "Alarms", "Queues across the cluster", FLOWING, WAITING),
                         driver.find_element("tag name", "body").text)
    assert traffic.error is None, traffic.error

    open_view(driver, "groups")
    wait_page(driver, lambda: WAITING in text_of(driver, "groups-queue"), "the queue to choose")
    from selenium.webdriver.support.ui import Select
    Select(driver.find_element("id", "groups-queue")).select_by_value(WAITING)
    assert Select(driver.find_element("id", "groups-order")).first_selected_option.get_attribute("value") == "backlog"
    assert Select(driver.find_element("id", "groups-node")).first_selected_option.text == "every node"
    driver.find_element("id", "groups-search").click()
    shown = lambda: [(row.get_attribute("data-group"), row.find_element("css selector", "td.depth").text)  # noqa: E731
                     for row in driver.find_elements("css selector", "#groups tbody tr")]
    expected = [(group, str(BACKLOGS[group])) for group in ("hot-a", "hot-b", "warm-c", "cool-d")]  # largest first
    wait_page(driver, lambda: shown() == expected, f"the hot groups {expected}")
    assert text_of(driver, "groups-title") == "Hot groups: largest backlog first"
    check_screenshot(driver.get_screenshot_as_png(), tmp_path / "hot-groups.png", viewport(driver),
                     ("Hot groups: largest backlog first", "hot-a", "hot-b", "warm-c"),
                     driver.find_element("tag name", "body").text)

    status, page = api(cluster.nodes[1], f"/api/groups?queue={WAITING}&order=backlog&page_size=2&position=1",
                       "admin", PASSWORD)  # the second and third, from another node's console
    assert status == 200 and [row["group"] for row in page["groups"]] == ["hot-b", "warm-c"], page
    status, page = api(cluster.nodes[1], f"/api/groups?queue={WAITING}&order=rate", "admin", PASSWORD)
    assert status == 400 and "order: expected one of backlog, head_age, owner" in page["error"], page
    # the new views sit behind the same login and permissions as the rest of the API
    third = cluster.nodes[2]
    assert api(third, "/api/overview")[0] == 401
    for path in ("/api/overview", f"/api/groups?queue={WAITING}&order=backlog"):
        status, answer = api(third, path, "sender", PASSWORD)
        assert status == 403 and "manage" in answer["error"], (path, answer)


def cell_under(chromium, table_id: str, row_selector: str, header: str) -> str:
    """The text of the first row's cell in the column headed `header` (found by its heading, not a class)."""
    headings = [cell.text for cell in chromium.find_elements("css selector", f"#{table_id} thead th")]
    return chromium.find_element("css selector", row_selector).find_elements("css selector", "td")[
        headings.index(header)].text


def viewport(chromium) -> tuple[int, int]:
    return tuple(chromium.execute_script("return [Math.round(window.innerWidth * window.devicePixelRatio), "
                                         "Math.round(window.innerHeight * window.devicePixelRatio)]"))
