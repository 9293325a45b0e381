"""deploy/prometheus/ as Prometheus' own tool reads it (issue 32): the scrape config and the alert rules
are valid (`promtool check`), and every alert fires from the fixtures of grouper-rules.test.yml and is
quiet before (`promtool test rules`, the README's command as written). Debian's `prometheus` package brings promtool (.ci/run installs
it); without it the test fails naming the package. tests/integration/test_prometheus.py runs the files
against a real cluster."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from tests.deploy.conftest import REPO

PROMETHEUS_DIR = REPO / "deploy" / "prometheus"
PROMTOOL_TIMEOUT_S = 60


def promtool(*args: str) -> str:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("`promtool` is not installed: `apt-get install prometheus` (.ci/run installs it)", pytrace=False)
    result = subprocess.run([binary, *args], cwd=REPO, capture_output=True, text=True,
                            timeout=PROMTOOL_TIMEOUT_S)
    assert result.returncode == 0, f"promtool {' '.join(args)} failed:\n{result.stdout}{result.stderr}"
    return result.stdout + result.stderr


def test_promtool_finds_the_scrape_config_and_its_rules_valid():
    checked = promtool("check", "config", "deploy/prometheus/prometheus.yml")
    assert "SUCCESS: 1 rule files found" in checked, checked
    rules = yaml.safe_load((PROMETHEUS_DIR / "grouper-rules.yml").read_text())
    count = sum(len(group["rules"]) for group in rules["groups"])
    assert f"SUCCESS: {count} rules found" in promtool("check", "rules", "deploy/prometheus/grouper-rules.yml")


def test_every_alert_fires_from_its_fixture_and_not_before():
    rules = yaml.safe_load((PROMETHEUS_DIR / "grouper-rules.yml").read_text())
    tests = yaml.safe_load((PROMETHEUS_DIR / "grouper-rules.test.yml").read_text())
    alerts = [rule["alert"] for group in rules["groups"] for rule in group["rules"]]
    fired = [case["alertname"] for test in tests["tests"] for case in test["alert_rule_test"] if case["exp_alerts"]]
    assert sorted(fired) == sorted(alerts), "one firing case per alert of grouper-rules.yml"
    commands = [line.split("  #", 1)[0].split() for line in readme_monitoring_block() if line.startswith("promtool ")]
    assert commands == [["promtool", "test", "rules", "deploy/prometheus/grouper-rules.test.yml"]], commands
    assert "SUCCESS" in promtool(*commands[0][1:])  # the README's command, from the clone's root


def readme_monitoring_block() -> list[str]:
    """The lines of the first ```sh block of the README's "## Monitoring"."""
    text = (REPO / "README.md").read_text()
    block = text[text.index("```sh\n", text.index("## Monitoring")) + len("```sh\n"):]
    return block[:block.index("```")].splitlines()
