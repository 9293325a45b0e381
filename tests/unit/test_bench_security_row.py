"""bench/run.py's security row: which rows the secured node runs, and how the report states TLS's cost."""

import dataclasses

from bench import clients, matrix, run_report


def result(variant: str, durable: bool, broker_us: float, throughput: float = 20_000.0) -> dict:
    row = matrix.Row(variant, 1000, 100, durable, 2000)
    outcome = clients.RowOutcome(received=2000, unique=2000, throughput_per_s=throughput,
                                 broker_cpu_us_per_msg=broker_us, client_cpu_us_per_msg=15.0,
                                 groups_seen=1000, per_consumer=[500, 500, 500, 500])
    return {**dataclasses.asdict(row), "system": row.system, "load_1m": 1.0, **dataclasses.asdict(outcome)}


def test_the_secured_node_runs_the_thousand_group_prefetch_hundred_rows_of_the_matrix():
    rows = matrix.matrix(["grouper"], 2000, [4, 1000], [1, 100], [False, True], 5000)

    secured = matrix.security_rows(rows, 2000)

    assert [(row.variant, row.key()) for row in secured] == [("grouper-tls", (1000, 100, False)),
                                                              ("grouper-tls", (1000, 100, True))]
    assert all(row.system == "grouper-tls" for row in secured)


def test_no_security_rows_when_the_matrix_has_none_of_their_keys():
    assert matrix.security_rows(matrix.matrix(["grouper"], 2000, [4], [1], [False], 0), 2000) == []


def test_the_report_gives_tls_cost_per_message_against_the_plain_row():
    results = [result("grouper", False, 25.0), result("grouper-tls", False, 31.5, 18_000.0)]

    notes = run_report.security_cost(results)

    assert len(notes) == 1
    assert "31.5 µs/msg against 25.0" in notes[0] and "+6.5 µs per message (±5.0" in notes[0] and "1.26x" in notes[0]


def test_the_table_shows_the_secured_row_beside_the_plain_one_with_its_ratio():
    report = {"date": "d", "command": "c", "machine": {"cores": "2", "kernel": "k"}, "versions": {}, "messages": 2000,
              "body_bytes": 100, "results": [result("grouper-tls", False, 30.0), result("grouper", False, 25.0)]}

    lines = run_report.render(report).splitlines()

    plain = next(index for index, line in enumerate(lines) if "| Grouper, exclusive groups" in line)
    assert "Grouper over TLS, SASL PLAIN" in lines[plain + 1] and "| 1.20 |" in lines[plain + 1]
