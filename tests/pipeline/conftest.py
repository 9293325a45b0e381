"""One Spark session for the whole pipeline suite: local[2], bound to loopback.

Starting a session costs 6-9 s on this machine kind, so tests share it; each test uses its own
queues and paths so they cannot see each other's data.
"""

import os

import pytest

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # else Spark binds the machine's external interface
os.environ.setdefault("PYSPARK_PYTHON", os.environ.get("PYSPARK_PYTHON", __import__("sys").executable))


@pytest.fixture(scope="session")
def spark():
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("grouper-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.sql.shuffle.partitions", "4")
               .config("spark.driver.memory", "2g")
               .getOrCreate())
    session.sparkContext.setLogLevel("WARN")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def grouper_node(tmp_path_factory):
    """One node for the source and sink tests (queues auto-created, no fsync); each test uses its own queues."""
    from tests.integration.harness import NodeProcess

    node = NodeProcess(tmp_path_factory.mktemp("grouper") / "node", "", ("--no-fsync",)).start()
    yield node
    node.kill()


@pytest.fixture(scope="session")
def grouper_spark(spark):
    """The shared session with the "grouper" format registered."""
    import pipeline

    pipeline.register(spark)
    return spark
