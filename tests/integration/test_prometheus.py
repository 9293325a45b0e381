"""The monitoring we ship (deploy/prometheus/, deploy/grafana/) against a real `grouper up` (issue 32).

What is promised (README, "Monitoring"): Debian's `prometheus`, given deploy/prometheus/prometheus.yml,
scrapes the nodes of `grouper up` and loads the alert rules beside it; the rules and the Grafana
dashboard name only metrics a node's /metrics exports, with labels it gives them.

Rules:
- One `grouper up --config examples/grouper.toml` per module, on free ports; the shipped scrape config
  is used with only its ports moved to that cluster's (5675 + 10*i -> base + 3 + 10*i), its intervals
  shortened to SCRAPE_INTERVAL and its rule file named by absolute path.
- Every wait is bounded and polls Prometheus' HTTP API; Prometheus and the cluster are stopped whatever
  happened. No Prometheus is a failure naming the package (.ci/run installs it), never a skip.
- The node-down test kills a node: it runs last in this module.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from tests.integration.cluster import free_ports
from tests.integration.grouper_up import GrouperUp
from tests.integration.harness import REPO

PROMETHEUS_DIR = REPO / "deploy" / "prometheus"
DASHBOARD = REPO / "deploy" / "grafana" / "grouper-dashboard.json"
README_BASE_PORT = 5672  # `grouper up`'s default --base-port, whose HTTP ports the shipped config names
HTTP_PORT_OFFSET = 3  # node i's HTTP port is base + 10*i + 3 (node/up.py)
SCRAPE_INTERVAL = "1s"  # scrapes and rule evaluations, so the test waits seconds, not the shipped 15 s
PROMETHEUS_WAIT_S = 15.0  # bound of each wait on Prometheus: its start, a scrape, a rule evaluation
HTTP_TIMEOUT_S = 2.0
# labels Prometheus adds to every series it scrapes, and the histogram buckets' own
SCRAPE_LABELS = {"instance", "job", "le"}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
                "offset", "inf", "nan"}


def prometheus_binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"`{name}` is not installed: `apt-get install prometheus` (Debian's package; .ci/run "
                    "installs it)", pytrace=False)
    return found


# ---- what a node exports, what the files ask for --------------------------------------------------

def exported(text: str) -> dict[str, set[str]]:
    """Every series name a /metrics text declares or holds (a histogram's _bucket, _count and _sum
    included), each with the label names its samples carry (none known for a family without samples)."""
    names: dict[str, set[str]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            suffixes = ("_bucket", "_count", "_sum") if kind == "histogram" else \
                ("_count", "_sum") if kind == "summary" else ("",)
            for suffix in suffixes:
                names.setdefault(name + suffix, set())
        elif line and not line.startswith("#"):
            match = re.match(r"([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*?)\})?\s", line)
            assert match, f"unparsable /metrics line {line!r}"
            names.setdefault(match.group(1), set()).update(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)=\"", match.group(2) or ""))
    return names


def metric_names(expr: str) -> set[str]:
    """The series names a PromQL expression selects (functions, keywords, label names and numbers left out)."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings: label values, regexes
    bare = re.sub(r"\{[^}]*\}", "", bare)  # label matchers
    bare = re.sub(r"\[[^\]]*\]", "", bare)  # range selectors
    bare = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", bare)  # label lists
    names = set()
    for match in re.finditer(r"(?<![A-Za-z0-9_:.])[A-Za-z_:][A-Za-z0-9_:]*", bare):
        if bare[match.end():].lstrip().startswith("(") or match.group(0).lower() in PROMQL_WORDS:
            continue  # a function call, or a keyword
        names.add(match.group(0))
    return names


def label_names(expr: str, legend: str = "") -> set[str]:
    """Label names an expression groups, matches or joins on, and those its legend shows."""
    labels = set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"", expr))
    for group in re.findall(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", expr):
        labels.update(name.strip() for name in group.split(",") if name.strip())
    return labels | set(re.findall(r"\{\{\s*(?:\$labels\.)?([A-Za-z_][A-Za-z0-9_]*)\s*\}\}", legend))


def dashboard_queries() -> list[tuple[str, str, str]]:
    """(panel title, expr, legend) of every query of the Grafana dashboard."""
    dashboard = json.loads(DASHBOARD.read_text())
    queries = [(panel["title"], target["expr"], target.get("legendFormat", ""))
               for panel in dashboard["panels"] for target in panel.get("targets", [])]
    assert len(queries) > 10, f"{DASHBOARD} has {len(queries)} queries"
    return queries


def rule_queries() -> list[tuple[str, str, str]]:
    """(alert name, expr, its annotations' text) of every rule of the shipped rule file."""
    groups = yaml.safe_load((PROMETHEUS_DIR / "grouper-rules.yml").read_text())["groups"]
    return [(rule["alert"], rule["expr"], " ".join(rule.get("annotations", {}).values()))
            for group in groups for rule in group["rules"]]


def unknown_names_and_labels(queries: list[tuple[str, str, str]], metrics: dict[str, set[str]]) -> list[str]:
    problems = []
    for title, expr, legend in queries:
        names = metric_names(expr)
        assert names, f"{title}: no series name found in {expr!r}"
        problems += [f"{title}: {name} is not exported" for name in sorted(names - set(metrics) - {"up"})]
        known = SCRAPE_LABELS.union(*(metrics.get(name, set()) for name in names))
        if all(metrics.get(name) for name in names - {"up"}):  # every family had samples: its labels are known
            problems += [f"{title}: label {label!r} is on none of {sorted(names)}"
                         for label in sorted(label_names(expr, legend) - known)]
    return problems


# ---- a cluster and a Prometheus --------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    up = GrouperUp(tmp_path_factory.mktemp("up") / "data", args=("--config", str(REPO / "examples" / "grouper.toml")))
    up.start()
    try:
        yield up
    finally:
        up.kill_tree()


def node_pid(up: GrouperUp, index: int) -> int:
    """The `grouper node` process of node `index`: the one of the tree whose --data-dir is DATA/node<index>."""
    data_dir = str(up.data_dir / f"node{index}")
    for pid in up.tree:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
        except OSError:
            continue
        if "--data-dir" in argv and argv[argv.index("--data-dir") + 1] == data_dir:
            return pid
    raise AssertionError(f"no process of grouper up runs with --data-dir {data_dir}: {up.tree}")


def http_targets(up: GrouperUp) -> list[str]:
    return [f"127.0.0.1:{up.base_port + 10 * index + HTTP_PORT_OFFSET}" for index in range(up.nodes)]


def scrape_config_for(up: GrouperUp, directory: Path) -> Path:
    """The shipped prometheus.yml, moved to this cluster's ports, scraping every SCRAPE_INTERVAL."""
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())

    def moved(target: str) -> str:
        host, port = target.rsplit(":", 1)
        offset = int(port) - README_BASE_PORT
        assert offset in {10 * index + HTTP_PORT_OFFSET for index in range(up.nodes)}, \
            f"{target} in prometheus.yml is no HTTP port of `grouper up` (base {README_BASE_PORT})"
        return f"{host}:{up.base_port + offset}"

    for job in config["scrape_configs"]:
        for static in job["static_configs"]:
            static["targets"] = [moved(target) for target in static["targets"]]
    config["global"].update(scrape_interval=SCRAPE_INTERVAL, scrape_timeout=SCRAPE_INTERVAL,
                            evaluation_interval=SCRAPE_INTERVAL)
    config["rule_files"] = [str(PROMETHEUS_DIR / name) for name in config["rule_files"]]
    path = directory / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


class Prometheus:
    def __init__(self, config: Path, directory: Path):
        self.port = free_ports(1)[0]
        self.log = directory / "prometheus.log"
        with open(self.log, "w") as log:
            self.process = subprocess.Popen(
                [prometheus_binary("prometheus"), f"--config.file={config}", f"--storage.tsdb.path={directory / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT)

    def api(self, path: str, **query) -> list | dict | None:
        """The `data` of an API answer, or None while Prometheus does not answer yet."""
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(query)}"
        assert self.process.poll() is None, f"prometheus exited {self.process.returncode}:\n{self.log.read_text()}"
        try:
            with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
                answer = json.load(response)
        except OSError:
            return None
        assert answer["status"] == "success", answer
        return answer["data"]

    def wait(self, what: str, read, done):
        """read() until done(its value), within PROMETHEUS_WAIT_S; fails naming `what` and the last value."""
        deadline = time.monotonic() + PROMETHEUS_WAIT_S
        while True:
            value = read()
            if value is not None and done(value):
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"{what} not within {PROMETHEUS_WAIT_S} s; last: {value}\n{self.log.read_text()}")
            time.sleep(0.2)

    def query(self, expr: str) -> list | None:
        data = self.api("query", query=expr)
        return None if data is None else data["result"]

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def prometheus(cluster, tmp_path):
    server = Prometheus(scrape_config_for(cluster, tmp_path), tmp_path)
    try:
        yield server
    finally:
        server.stop()


# ---- the tests ----------------------------------------------------------------------------------

def test_the_promql_reading_finds_series_names_and_labels_and_leaves_functions_keywords_and_numbers():
    expr = ('max without (instance) (grouper_raft_commit_index) - ignoring (instance) group_right '
            'grouper_raft_last_applied > 1e3 and histogram_quantile(0.99, sum by (le, queue) '
            '(rate(grouper_x_bucket{outcome=~"refused|timed_out"}[5m] offset 1m))) or up{job="grouper"} == bool 0')
    assert metric_names(expr) == {"grouper_raft_commit_index", "grouper_raft_last_applied", "grouper_x_bucket", "up"}
    assert label_names(expr, "{{instance}} -> {{ $labels.owner }} {{ $value }}") == {
        "instance", "le", "queue", "outcome", "job", "owner"}


def test_the_dashboard_and_the_alert_rules_name_only_metrics_and_labels_a_node_exports(cluster):
    with urllib.request.urlopen(f"http://{http_targets(cluster)[0]}/metrics", timeout=HTTP_TIMEOUT_S) as response:
        metrics = exported(response.read().decode())
    problems = unknown_names_and_labels(dashboard_queries(), metrics) + unknown_names_and_labels(rule_queries(), metrics)
    assert not problems, "\n".join(problems)


def test_prometheus_scrapes_every_node_of_grouper_up_and_loads_the_rules_and_a_dead_node_raises_node_down(
        cluster, prometheus):
    targets = http_targets(cluster)
    up = prometheus.wait("up = 1 for every node", lambda: prometheus.query('up{job="grouper"}'),
                         lambda result: sorted((row["metric"]["instance"], row["value"][1]) for row in result)
                         == [(target, "1") for target in targets])
    assert all(row["metric"]["job"] == "grouper" for row in up), up
    depth = prometheus.wait("the queue depth of `orders` from every node",
                            lambda: prometheus.query("grouper_queue_depth_messages"),
                            lambda result: sorted(row["metric"]["instance"] for row in result
                                                  if row["metric"].get("queue") == "orders") == targets)
    assert {row["metric"]["queue"] for row in depth} >= {"orders", "carts"}, depth
    assert {tuple(sorted(row["metric"])) for row in depth} == {("__name__", "instance", "job", "queue")}, depth
    prometheus.wait("every node connected to the 2 other raft members",
                    lambda: prometheus.query("grouper_raft_connected_members == 2 and grouper_raft_members == 3"),
                    lambda result: sorted(row["metric"]["instance"] for row in result) == targets)
    lag = prometheus.query(next(expr for alert, expr, _ in rule_queries() if alert == "GrouperRaftMemberLagging")
                           .split(" > ")[0])  # the alert's lag, per member, on the real series
    assert sorted(row["metric"]["instance"] for row in lag) == targets and all(
        0 <= float(row["value"][1]) < 1000 for row in lag), lag
    leader = prometheus.query("count by (leader) (grouper_raft_leader == 1)")
    assert len(leader) == 1, f"the nodes name different raft leaders: {leader}"

    expected = {alert for alert, _, _ in rule_queries()}
    rules = prometheus.wait("every rule loaded and evaluated", lambda: prometheus.api("rules"), lambda data: [
        rule for group in data["groups"] for rule in group["rules"]
        if rule["health"] == "ok" and rule["lastEvaluation"] > "1970"] and {
        rule["name"] for group in data["groups"] for rule in group["rules"]} == expected)
    assert all(rule["health"] == "ok" and not rule.get("lastError") for group in rules["groups"]
               for rule in group["rules"]), rules
    assert not prometheus.api("alerts")["alerts"], "a healthy cluster raises alerts"

    # node2 dies: its target goes down and GrouperNodeDown becomes pending for it (firing after its `for`)
    os.kill(node_pid(cluster, 2), signal.SIGKILL)
    alerts = prometheus.wait("GrouperNodeDown pending for node2", lambda: prometheus.api("alerts"), lambda data: [
        alert for alert in data["alerts"] if alert["labels"]["alertname"] == "GrouperNodeDown"])
    down = [alert for alert in alerts["alerts"] if alert["labels"]["alertname"] == "GrouperNodeDown"]
    assert [(alert["labels"]["instance"], alert["state"]) for alert in down] == [(targets[2], "pending")], down
