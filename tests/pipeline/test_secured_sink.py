"""The Spark sink writes to a secured node over TLS, its password read from a file as a mounted
Kubernetes Secret would give it: the one Spark test of security (the client's own are in
test_client_security.py)."""

from __future__ import annotations

import pipeline
from pipeline.security import Security
from tests.pipeline.conftest import SECURED_USER, amqps_address
from tests.pipeline.test_client_security import take_all


def test_write_grouped_over_tls_with_a_password_file_reaches_the_queue_in_group_order(grouper_spark, secured_node,
                                                                                      security_files):
    rows = [(f"g{seq % 5}", seq, f"m{seq}") for seq in range(500)]
    df = grouper_spark.createDataFrame(rows, "grp string, seq long, body string")
    address = amqps_address(secured_node)

    pipeline.write_grouped(df, group="grp", order_by="seq", partitions=2, nodes=address, queue="spark-tls",
                           user=SECURED_USER, passwordFile=str(security_files.password_file),
                           caFile=str(security_files.ca_file))

    security = Security(user=SECURED_USER, password_file=str(security_files.password_file), tls=True,
                        ca_file=str(security_files.ca_file))
    received = take_all(address, security, "spark-tls", 500)
    assert len(received) == 500
    for group in {group for group, _, _ in rows}:
        assert [row[1] for row in received if row[0] == group] == \
            [body.encode() for g, _, body in rows if g == group]
