"""The web console in a real browser: Debian's headless chromium, driven by selenium through
chromedriver, against a 3-node cluster of real `grouper node` processes with a users file.

Rules of this file:
- chromium and chromedriver are the system's (.ci/run installs Debian's `chromium` and
  `chromium-driver`); without them the tests fail saying what to install, never skip.
- One cluster and one browser for the module; the wrong-password test logs in wrong on a node the other test does not
  log in to, fewer times than the failed-login throttle allows, so the throttle never decides a result.
- Every wait is bounded and polls the page or the admin API; nothing asserts an upper bound on time.
"""

from __future__ import annotations

import base64
import io
import json
import shutil
import urllib.error
import urllib.request

import pytest
from proton.utils import BlockingConnection

from tests.integration.cli import write_users_file
from tests.integration.cluster import Cluster
from tests.integration.harness import WAIT_S, ManualReceiver, NodeProcess, grouped

PASSWORD = "console pass phrase"
USERS = {"admin": "administrator", "sender": "sender"}
ROLES = {"sender": "send:orders"}
QUEUE = "orders"
MOVED_TO = "orders.moved"  # where the page moves a group
WINDOW = (1280, 900)  # the browser's window in pixels; the screenshot is its viewport (the window less its frame)
BROWSER_WAIT_S = 20.0  # bound of each wait for the page to show something


def browser(arguments: tuple = ()):
    """Headless chromium of the system, or a failure naming the packages to install; `arguments`: more
    command-line switches."""
    missing = [name for name in ("chromium", "chromedriver") if shutil.which(name) is None]
    if missing:
        pytest.fail(f"{' and '.join(missing)} not found: the console test needs Debian's chromium and "
                    f"chromium-driver (apt-get install chromium chromium-driver, as .ci/run does)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                     f"--window-size={WINDOW[0]},{WINDOW[1]}", "--no-first-run", "--no-proxy-server", *arguments):
        options.add_argument(argument)
    # the driver is named, so selenium never looks for one to download (nothing outside is reachable)
    return webdriver.Chrome(service=Service(shutil.which("chromedriver")), options=options)


@pytest.fixture(scope="module")
def users(tmp_path_factory):
    return write_users_file(tmp_path_factory.mktemp("users") / "users.json", ROLES, USERS, PASSWORD)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, users):
    with pytest.MonkeyPatch.context() as environment:
        # the harness's status polls run `grouper cluster status` with the environment's credentials
        environment.setenv("GROUPER_USER", "admin")
        environment.setenv("GROUPER_PASSWORD", PASSWORD)
        nodes = Cluster(tmp_path_factory.mktemp("cluster"), config_text=f'[[queue]]\nname = "{QUEUE}"\n\n'
                                                                         f'[[queue]]\nname = "{MOVED_TO}"\n',
                        args=("--users-file", str(users), "--sasl-plain-on-loopback", "--placement", "local"))
        try:
            nodes.start()
            yield nodes
        finally:
            nodes.kill_all()


@pytest.fixture(scope="module")
def driver():
    """One browser for the module (its start costs seconds); each test loads its page afresh, and the
    page keeps its login in memory only, so nothing carries over from one test to the next."""
    chromium = browser()
    chromium.set_page_load_timeout(BROWSER_WAIT_S)
    try:
        yield chromium
    finally:
        chromium.quit()


def connect_as_admin(node) -> BlockingConnection:
    return BlockingConnection(node.url, timeout=WAIT_S, user="admin", password=PASSWORD, allowed_mechs="PLAIN",
                              allow_insecure_mechs=True)


def wait_page(chromium, condition, what: str):
    """condition()'s first true value. The cluster and queues views redraw their tables every few
    seconds, so an element found there may be replaced before it is read: that try is made again."""
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(chromium, BROWSER_WAIT_S, poll_frequency=0.1,
                             ignored_exceptions=(StaleElementReferenceException,)).until(lambda _: condition())
    except TimeoutException:
        raise AssertionError(f"the console did not show {what} within {BROWSER_WAIT_S} s; it shows:\n"
                             f"{chromium.find_element('tag name', 'body').text}") from None


def text_of(chromium, element_id: str) -> str:
    return chromium.find_element("id", element_id).text


def log_in(chromium, node, user: str, password: str) -> None:
    chromium.get(f"http://{node.http_address}/")
    wait_page(chromium, lambda: chromium.find_element("id", "login").is_displayed(), "its login form")
    chromium.find_element("id", "login-user").send_keys(user)
    chromium.find_element("id", "login-password").send_keys(password)
    chromium.find_element("id", "login-submit").click()


def open_view(chromium, view: str) -> None:
    """Click a view's tab once the page shows the tabs (after its session call answered)."""
    tab = f'#tabs button[data-view="{view}"]'
    wait_page(chromium, lambda: chromium.find_element("css selector", tab).is_displayed(), f"the {view} tab")
    chromium.find_element("css selector", tab).click()


def api(node, path: str, user: str = "", password: str = "", *, body: bytes | None = None,
        content_type: str = "application/json") -> tuple[int, dict]:
    headers = {"Content-Type": content_type} if body is not None else {}
    if user:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    request = urllib.request.Request(f"http://{node.http_address}{path}", data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=WAIT_S) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def group_row(chromium, group: str):
    rows = chromium.find_elements("css selector", f'#groups tbody tr[data-group="{group}"]')
    return rows[0] if rows else None


def owner_shown(chromium, group: str) -> str | None:
    row = group_row(chromium, group)
    return row.find_element("class name", "owner").text if row is not None else None


def owner_id(chromium, group: str) -> str | None:
    """The owning consumer's id, which the page keeps beside the container/link it shows."""
    row = group_row(chromium, group)
    return row.find_element("class name", "owner").get_attribute("data-consumer") if row is not None else None


def test_the_console_shows_the_cluster_lists_groups_and_resets_one(cluster, driver, tmp_path):
    first = cluster.nodes[0]
    connection = connect_as_admin(first)
    try:
        consumer = ManualReceiver(connection, QUEUE, "console-test-consumer")
        cluster.wait_consumers(QUEUE, {0: 1})
        sender = connection.create_sender(QUEUE)
        for group, count in (("g-reset", 3), ("g-a", 2), ("g-b", 1)):
            for index in range(count):
                sender.send(grouped(f"{group}-{index}", group))
        consumer.fetch().accept()  # g-reset's first message: the consumer owns g-reset, with no credit left

        log_in(driver, first, "admin", PASSWORD)
        open_view(driver, "cluster")  # the page opens on the overview (tests/integration/test_console_overview.py)
        leader = cluster.status()["leader"]  # named by its AMQP address, its raft address beside it
        wait_page(driver, lambda: text_of(driver, "leader").endswith(f"(raft {leader})"), f"the leader {leader}")
        wait_page(driver, lambda: len(driver.find_elements("css selector", "#members tbody tr")) == 3
                  and all(cell.text == "ready" for cell in driver.find_elements("css selector", "#members td.good"))
                  and len(driver.find_elements("css selector", "#members td.good")) == 3, "3 ready members")
        assert text_of(driver, "who") == "logged in as admin"
        # node 0 placed 3 new groups (placement local): each waited for its route, through raft
        wait_page(driver, lambda: "routed 3" in text_of(driver, "decisions"), "3 routed decisions")
        assert "wait for a route: p50 under" in text_of(driver, "decisions")
        assert not driver.find_element("id", "open-notice").is_displayed()

        open_view(driver, "groups")
        wait_page(driver, lambda: QUEUE in text_of(driver, "groups-queue"), "the queue to choose")
        from selenium.webdriver.support.ui import Select
        Select(driver.find_element("id", "groups-queue")).select_by_value(QUEUE)
        Select(driver.find_element("id", "groups-node")).select_by_value(cluster.node_ids[0])
        driver.find_element("id", "groups-search").click()
        consumer_id = wait_page(driver, lambda: owner_shown(driver, "g-reset") not in (None, "none")
                                and owner_id(driver, "g-reset"), "g-reset with its owner")
        assert owner_shown(driver, "g-reset").endswith("/console-test-consumer"), owner_shown(driver, "g-reset")
        # the page may still be drawing the groups it asked for on opening the view: each check waits
        wait_page(driver, lambda: {row.get_attribute("data-group") for row in driver.find_elements(
            "css selector", "#groups tbody tr")} == {"g-reset", "g-a", "g-b"}, "the three groups")
        wait_page(driver, lambda: group_row(driver, "g-reset").find_element("css selector", "td.depth").text == "2"
                  and owner_shown(driver, "g-a") == "none", "g-reset's depth 2 and g-a without owner")

        wait_page(driver, lambda: group_row(driver, "g-reset").find_element("class name", "reset").click() or True,
                  "g-reset's Reset button")
        alert = wait_page(driver, lambda: _alert(driver), "a confirmation dialog")
        assert "Reset group g-reset of queue orders" in alert.text
        alert.accept()
        wait_page(driver, lambda: owner_shown(driver, "g-reset") == "none", "g-reset without an owner")
        assert "1 owner(s) let go" in text_of(driver, "action-result")
        rows = {row["group"]: row for row in cluster.groups(QUEUE)}
        assert rows["g-reset"]["consumer"] is None and rows["g-reset"]["messages"] == 2  # the admin API agrees
        act_on_group(driver, "g-b", "move", MOVED_TO, f"Move group g-b of queue orders to queue {MOVED_TO}?")
        wait_page(driver, lambda: group_row(driver, "g-b") is None, "g-b gone from orders")
        assert text_of(driver, "action-result") == f"group g-b: 1 message(s) moved to {MOVED_TO}"
        assert [(row["group"], row["messages"]) for row in cluster.groups(MOVED_TO)] == [("g-b", 1)]
        # Qpid's reroute, for one group: its backlog goes to the other queue, in order, once stored there
        act_on_group(driver, "g-a", "reroute", MOVED_TO,
                     f"Reroute every available message of group g-a of queue orders to {MOVED_TO}?")
        wait_page(driver, lambda: group_row(driver, "g-a") is None, "g-a gone from orders")
        assert text_of(driver, "action-result") == f"group g-a of queue orders: 2 message(s) rerouted to {MOVED_TO}"
        assert sorted((row["group"], row["messages"]) for row in cluster.groups(MOVED_TO)) == [("g-a", 2), ("g-b", 1)]

        # another node's console pages the first node's groups on the caller's behalf
        status, page = api(cluster.nodes[2], f"/api/groups?queue={QUEUE}&node={cluster.node_ids[0]}&prefix=g-r",
                           "admin", PASSWORD)
        assert status == 200 and [(row["group"], row["consumer"], row["messages"]) for row in page["groups"]] \
            == [("g-reset", None, 2)], page

        open_view(driver, "consumers")
        wait_page(driver, lambda: driver.find_elements("css selector", f'#consumers tr[data-consumer="{consumer_id}"]'),
                  "the consumer")
        assert "console-test-consumer" in text_of(driver, "consumers")
        client = driver.find_element("css selector", f'#consumers tr[data-consumer="{consumer_id}"] td.client').text
        assert client.startswith("127.0.0.1:") and client.endswith(" (admin)"), client  # its address and user

        open_view(driver, "groups")
        wait_page(driver, lambda: group_row(driver, "g-reset") is not None, "the groups again")
        viewport = tuple(driver.execute_script("return [Math.round(window.innerWidth * window.devicePixelRatio), "
                                               "Math.round(window.innerHeight * window.devicePixelRatio)]"))
        check_screenshot(driver.get_screenshot_as_png(), tmp_path / "console.png", viewport,
                         ("Groups", "g-reset", "logged in as admin"), driver.find_element("tag name", "body").text)
    finally:
        connection.close()


def confirm(chromium, expected: str) -> None:
    alert = wait_page(chromium, lambda: _alert(chromium), "a confirmation dialog")
    assert expected in alert.text, alert.text
    alert.accept()


def act_on_group(chromium, group: str, button: str, destination: str, question: str) -> None:
    """Click a group row's action button, give the destination it prompts for, confirm `question`."""
    wait_page(chromium, lambda: group_row(chromium, group).find_element("class name", button).click() or True,
              f"{group}'s {button} button")
    prompt = wait_page(chromium, lambda: _alert(chromium), f"the {button} destination prompt")
    prompt.send_keys(destination)
    prompt.accept()
    confirm(chromium, question)


def test_a_queue_is_added_and_deleted_through_the_page(cluster, driver):
    log_in(driver, cluster.nodes[0], "admin", PASSWORD)
    open_view(driver, "queues")
    wait_page(driver, lambda: driver.find_elements("css selector", f'#queues tr[data-queue="{QUEUE}"]'), "the queues")
    driver.find_element("id", "add-queue-name").send_keys("made.by.console")
    driver.find_element("id", "add-queue-settings").send_keys('{"group_buckets": 4}')
    driver.find_element("css selector", "#add-queue button").click()
    confirm(driver, "Add queue made.by.console")
    cluster.wait_for(lambda status: all(any(queue["name"] == "made.by.console" for queue in member["queues"])
                                        for member in status["members"]), "the new queue on every node")
    made = lambda: driver.find_elements("css selector", '#queues tr[data-queue="made.by.console"]')  # noqa: E731
    wait_page(driver, lambda: len(made()) == 1, "the new queue, one row for the cluster")

    connection = connect_as_admin(cluster.nodes[0])
    try:
        sender = connection.create_sender("made.by.console")
        for index in range(3):
            sender.send(grouped(f"to-purge-{index}", f"p{index}"))
    finally:
        connection.close()
    cluster.wait_for(lambda status: sum(queue["depth_messages"] for member in status["members"]
                                        for queue in member["queues"] if queue["name"] == "made.by.console") == 3,
                     "3 messages on the new queue")
    # Qpid's reroute of the first N of a queue: the page asks where to, how many, and to confirm
    wait_page(driver, lambda: made()[0].find_element("class name", "reroute").click() or True, "a Reroute button")
    for answer in (MOVED_TO, "1"):
        prompt = wait_page(driver, lambda: _alert(driver), "the reroute's prompts")
        prompt.send_keys(answer)
        prompt.accept()
    confirm(driver, f"Reroute the first 1 available messages of queue made.by.console to {MOVED_TO}?")
    wait_page(driver, lambda: text_of(driver, "queues-result")
              == f"queue made.by.console: 1 message(s) rerouted to {MOVED_TO}", "the reroute's result")
    assert ("p0", 1) in [(row["group"], row["messages"]) for row in cluster.groups(MOVED_TO)]
    wait_page(driver, lambda: made()[0].find_element("class name", "purge").click() or True, "a Purge button")
    confirm(driver, "Purge queue made.by.console")
    wait_page(driver, lambda: text_of(driver, "queues-result") == "queue made.by.console: 2 message(s) purged",
              "the purge's result")
    wait_page(driver, lambda: made()[0].find_element("class name", "delete").click() or True, "a Delete button")
    confirm(driver, "Delete queue made.by.console")  # empty now: no second question to force it
    cluster.wait_for(lambda status: not any(queue["name"] == "made.by.console" for member in status["members"]
                                            for queue in member["queues"]), "the queue gone from every node")
    wait_page(driver, lambda: not made(), "the queue gone")
    assert not driver.find_element("id", "error").is_displayed()


def _alert(chromium):
    from selenium.common.exceptions import NoAlertPresentException
    try:
        alert = chromium.switch_to.alert
        alert.text  # raises while no dialog is open
        return alert
    except NoAlertPresentException:
        return None


def check_screenshot(png: bytes, path, viewport: tuple[int, int], expected_texts: tuple[str, ...],
                     visible_text: str) -> None:
    from PIL import Image

    path.write_bytes(png)  # kept in the test's directory for a person to look at
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "the screenshot is not a PNG"
    image = Image.open(io.BytesIO(png)).convert("RGB")
    assert image.size == viewport, f"screenshot of {image.size}, the page's viewport is {viewport}"
    assert image.size[0] == WINDOW[0] and image.size[1] > WINDOW[1] // 2, f"a viewport of {image.size} in a {WINDOW} window"
    colours = image.getcolors(maxcolors=1 << 16)
    assert colours is None or len(colours) > 20, f"the screenshot is nearly blank: {len(colours)} colours"
    for text in expected_texts:
        assert text in visible_text, f"{text!r} is not on the page:\n{visible_text}"


def test_a_wrong_password_is_refused_and_a_user_sees_only_what_it_may(cluster, driver):
    second = cluster.nodes[1]
    log_in(driver, second, "admin", "not the password")
    wait_page(driver, lambda: "unknown user or wrong password" in text_of(driver, "error"), "the refusal")
    assert driver.find_element("id", "login").is_displayed()
    assert not driver.find_element("id", "tabs").is_displayed()

    status, answer = api(second, "/api/cluster", "admin", "wrong again")
    assert status == 401 and "unknown user or wrong password" in answer["error"]
    assert PASSWORD not in json.dumps(answer)
    status, answer = api(second, "/api/cluster", "sender", PASSWORD)
    assert status == 403 and "manage" in answer["error"], answer
    status, answer = api(second, f"/api/groups?queue={QUEUE}", "sender", PASSWORD)
    assert status == 403 and "manage" in answer["error"], answer
    status, answer = api(second, "/api/session", "admin", PASSWORD)  # ends the failure streak
    assert status == 200 and answer == {"open": False, "user": "admin"}


def test_an_open_node_says_so_and_refuses_bad_requests_clearly(tmp_path, driver):
    node = NodeProcess(tmp_path / "open", f'[[queue]]\nname = "{QUEUE}"\n').start()
    try:
        driver.get(f"http://{node.http_address}/")
        wait_page(driver, lambda: driver.find_element("id", "open-notice").is_displayed(), "the open-node notice")
        wait_page(driver, lambda: text_of(driver, "overview-leader") == "a single node (no cluster)", "a single node")
        open_view(driver, "cluster")
        wait_page(driver, lambda: text_of(driver, "cluster-node") == "a single node (no cluster)", "a single node")
        assert not driver.find_element("id", "login").is_displayed()

        assert api(node, "/api/queues", body=b'{"name": "x"}', content_type="text/plain")[0] == 415
        status, answer = api(node, "/api/queues", body=b"{not json")
        assert status == 400 and "not JSON" in answer["error"]
        status, answer = api(node, "/api/queues", body=b'{"name": "y", "group_buckets": "many"}')
        assert status == 400 and "settings.group_buckets" in answer["error"], answer
        status, answer = api(node, "/api/queues", body=b"{" + b" " * (1 << 17) + b"}")
        assert status == 413
        status, answer = api(node, f"/api/groups?queue={QUEUE}&page_size=501")
        assert status == 400 and "page_size" in answer["error"]
        status, answer = api(node, "/api/groups?queue=nope")
        assert status == 404 and "nope" in answer["error"]
        status, answer = api(node, "/api/groups")
        assert status == 400 and 'query needs "queue"' in answer["error"], answer
        status, answer = api(node, "/api/groups/reset", body=b'{"queue": "nope", "group": "g"}')
        assert status == 404
        status, answer = api(node, "/api/groups/purge", body=json.dumps({"queue": QUEUE}).encode())
        assert status == 400 and '"group" is the group id' in answer["error"], answer
        status, answer = api(node, "/api/queues/purge", body=b'{"queue": ""}')
        assert status == 400 and 'body needs "queue"' in answer["error"], answer
        reroute = {"queue": QUEUE, "count": 2}
        status, answer = api(node, "/api/queues/reroute", body=json.dumps(reroute).encode())
        assert status == 400 and '{"to": ADDRESS}' in answer["error"], answer
        reroute.update(to="elsewhere", count=0)
        status, answer = api(node, "/api/queues/reroute", body=json.dumps(reroute).encode())
        assert status == 400 and '"count" must be a whole number >= 1' in answer["error"], answer
        del reroute["count"]
        status, answer = api(node, "/api/queues/reroute", body=json.dumps(reroute).encode())
        assert status == 404 and "no queue or multicast address 'elsewhere'" in answer["error"], answer
        # a name in the path is no API: the page never puts one there (a browser would normalise it)
        status, answer = api(node, f"/api/queues/{QUEUE}/purge", body=b"{}")
        assert status == 404 and '/api/queues/reroute with {"queue": Q}' in answer["error"], answer
        status, answer = api(node, "/api/elsewhere")
        assert status == 404 and "/api/groups?queue=Q" in answer["error"]
        assert [queue["name"] for queue in api(node, "/api/queues")[1]["members"][0]["queues"]] == [QUEUE]

        connection = BlockingConnection(node.url, timeout=WAIT_S)
        try:
            sender = connection.create_sender(QUEUE)
            for group in ("g1", None, "g1", "g2"):
                sender.send(grouped("x", group))
        finally:
            connection.close()
        purged = node.cli("queue", "purge", QUEUE)  # the CLI's way to the same admin call
        assert purged.returncode == 0, purged.stderr
        assert purged.stdout.strip() == f"purged 4 messages from queue {QUEUE}"  # the one in no group too
    finally:
        node.kill()


FAILURES_BEFORE_THROTTLE = 3  # node/admin/callers.py


def test_failed_console_logins_hold_the_address_back_on_the_admin_port_too(tmp_path, users):
    from node.admin.client import AccessDenied, AdminClient
    from node.admin.callers import basic_metadata

    node = NodeProcess(tmp_path / "secured", "", ("--users-file", str(users))).start()
    try:
        for _ in range(FAILURES_BEFORE_THROTTLE + 1):  # checked and refused; the last one starts the throttle
            status, answer = api(node, "/api/session", "admin", "guess")
            assert status == 401 and "wrong password" in answer["error"], answer
        status, answer = api(node, "/api/session", "admin", PASSWORD)  # right, but not checked while held
        assert status == 401 and "too many failed logins in a row from 127.0.0.1" in answer["error"], answer
        with AdminClient(node.admin_address, metadata=basic_metadata("admin", PASSWORD)) as admin:
            with pytest.raises(AccessDenied, match="too many failed logins"):  # one throttle per node
                admin.list_queues()
    finally:
        node.kill()
