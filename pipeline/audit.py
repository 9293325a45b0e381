"""The delivery audit job: judges drill delivery logs on Spark, per queue, as tests/drills/checker.py judges them.

The logs' format is pipeline/audit_input.py's header.

Rules:
- The verdicts and their counts equal checker.py's on the same lines, per queue: lost, duplicates,
  order violations (first acceptances out of order, and redeliveries after a later confirmed
  acceptance), exclusivity violations (a hold overlapping another consumer's earlier hold), refused
  delivered, unexpected, and the legal unconfirmed_delivered. Log order breaks ties of equal stamps as
  in the checker: the files as given (send files first), then line by line. A message's identity is
  (producer, group, sequence) and lives in one queue (a producer sends to one queue); an identity
  with a null part matches no send.
- Without send logs the job judges nothing that needs them (lost, refused delivered, unexpected,
  send-to-receive latency) and takes every delivered identity as accepted by the node, so the order
  checks still run; the report says so.
- Beyond the checker, per queue: duplicates whose every later delivery carried delivery-count > 0
  ("declared" redeliveries), groups whose consumer changed and why, the spread of groups and
  deliveries over consumers, latency percentiles. A consumer change is a delivery of a group to a
  consumer other than the one that received the group's previous delivery (by received_ms, then
  settled_ms, then log order). Its reason, looked for between the previous delivery's and this
  one's received_ms: an admin action on the group or the whole queue, else "consumer_gone" (the
  previous consumer detached, or its previous delivery was dropped or left unconfirmed by a lost
  connection), else "rebalance" (some consumer attached to the queue meanwhile), else
  "unexplained" (normal in shared queues, where a group is free whenever none of its messages is
  unsettled).
- Only Spark operators touch the lines (windows, aggregations, joins); the driver collects small
  per-queue and per-consumer aggregates and a few examples of each verdict, never the logs.
- Reading the logs is pipeline/audit_input.py's; the verdicts' frames are pipeline/audit_verdicts.py's.
"""

from __future__ import annotations

import os
from functools import reduce
from pathlib import Path
from typing import Iterable

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from pipeline import audit_chart, audit_report
from pipeline.audit_input import LOG_ORDER, AuditInputError, LogFiles, check_lines, read_lines, shuffle_partitions
from pipeline.audit_progress import AuditProgress
from pipeline.audit_verdicts import IDENTITY, REFUSED_OUTCOMES, Verdicts, flag, identity_text, queue_column

# the job's names its command and tests reach as audit.NAME
__all__ = ["AuditInputError", "LogFiles", "audit", "run", "session", "shuffle_partitions"]

EXAMPLES_MAX = 5  # examples of each verdict per queue
PERCENTILES = (0.5, 0.9, 0.99)
PERCENTILE_ACCURACY = 10_000  # percentile_approx: relative error 1/10,000 of the row count


def audit(spark: SparkSession, files: LogFiles) -> dict:
    """The report (plain data, see pipeline.audit_report) of the logs in `files`."""
    lines = read_lines(spark, files.all_paths).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        with AuditProgress(spark, 1 + _Judgement.STEPS) as progress:
            progress.step("reading the lines")
            kinds = check_lines(lines, files.all_paths)
            sends_logged = bool(files.send_paths) or kinds.get("send", 0) > 0
            return _Judgement(lines, sends_logged).report(files, kinds, progress)
    finally:
        lines.unpersist()


class _Judgement:
    """The job's frames over one read of the logs; `report()` runs it, in STEPS."""

    STEPS = 4  # the progress.step calls of report()

    def __init__(self, lines: DataFrame, sends_logged: bool):
        self.sends_logged = sends_logged
        self.lines = lines
        self.deliveries = self._deliveries(lines).persist(StorageLevel.MEMORY_AND_DISK)
        self.sends = lines.filter(F.col("kind") == "send").select(
            queue_column().alias("queue"), *IDENTITY, "sent_ms", "outcome", *LOG_ORDER)
        self.identities = self._identities().persist(StorageLevel.MEMORY_AND_DISK)
        self.events = lines.filter(F.col("kind").isin("attach", "detach", "admin")).select(
            "kind", queue_column().alias("queue"), "group", "consumer", "action", "at_ms").persist()
        self.timeline = self._timeline().persist(StorageLevel.MEMORY_AND_DISK)
        self.judged = Verdicts(self.identities, self.deliveries, self.timeline, self.events, self.sends_logged)

    def unpersist(self) -> None:
        for frame in (self.deliveries, self.identities, self.events, self.timeline):
            frame.unpersist()

    # ---- frames -------------------------------------------------------------------------------------

    @staticmethod
    def _deliveries(lines: DataFrame) -> DataFrame:
        by_identity = Window.partitionBy(*IDENTITY).orderBy("received_ms", *LOG_ORDER)
        # a line marked after_close never reached a consumer that could hold it: the checker leaves it out too
        return (lines.filter((F.col("kind") == "delivery") & ~F.coalesce("after_close", F.lit(False)))
                .select(queue_column().alias("queue"), *IDENTITY, "consumer", "received_ms", "settled_ms", "outcome",
                        F.coalesce("delivery_count", F.lit(0)).alias("delivery_count"),
                        F.coalesce("settle_confirmed", F.lit(True)).alias("confirmed"), *LOG_ORDER)
                .withColumn("index", F.row_number().over(by_identity) - 1)
                .withColumn("redelivery", (F.col("index") > 0) | (F.col("delivery_count") > 0))
                .withColumn("accepted", F.col("outcome") == "accepted")
                .withColumn("confirmed_acceptance", F.col("accepted") & F.col("confirmed")))

    def _timeline(self) -> DataFrame:
        """Each group's deliveries in order (received_ms, then settled_ms, then log order) with what came
        before them: the previous delivery (for consumer changes) and the run of holds they belong to.

        A hold is a confirmed, settled delivery; a run is a maximal sequence of one consumer's holds in
        that order. Consumer changes and overlapping holds share this one shuffle and sort."""
        in_group = Window.partitionBy("queue", "group").orderBy("received_ms", "settled_ms", *LOG_ORDER)
        before = in_group.rowsBetween(Window.unboundedPreceding, -1)
        hold = (F.col("confirmed") & (F.col("outcome") != "dropped") & F.col("settled_ms").isNotNull()
                & F.col("consumer").isNotNull())  # a hold nobody is named for clashes with no one
        starts_run = F.col("hold") & (F.col("previous_holder").isNull() | (F.col("previous_holder") != F.col("consumer")))
        return (self.deliveries
                .select("queue", "group", "consumer", "received_ms", "settled_ms", hold.alias("hold"),
                        identity_text().alias("identity"), *LOG_ORDER,
                        F.lag("consumer").over(in_group).alias("previous_consumer"),
                        F.lag("received_ms").over(in_group).alias("previous_received_ms"),
                        F.lag((F.col("outcome") == "dropped") | ~F.col("confirmed")).over(in_group)
                        .alias("previous_lost"),
                        F.last(F.when(hold, F.col("consumer")), ignorenulls=True).over(before).alias("previous_holder"))
                .withColumn("run", F.sum(flag(starts_run)).over(in_group.rowsBetween(Window.unboundedPreceding,
                                                                                     Window.currentRow)))
                .drop("previous_holder"))

    def _identities(self) -> DataFrame:
        """One row per identity delivered or sent: what its deliveries and its send say."""
        accepted, confirmed = F.col("accepted"), F.col("confirmed_acceptance")
        delivered = self.deliveries.groupBy(*IDENTITY).agg(
            F.min_by("queue", "index").alias("delivered_queue"),
            F.min_by("consumer", "index").alias("first_consumer"),
            F.min("received_ms").alias("first_received_ms"),
            F.count(F.lit(1)).alias("lines"),
            F.max(flag(accepted)).alias("any_accepted"),
            F.min(F.when(accepted, F.col("received_ms"))).alias("first_accepted_ms"),
            F.sum(flag(confirmed)).alias("confirmed_acceptances"),
            F.min(F.when(confirmed, F.col("received_ms"))).alias("first_confirmed_received_ms"),
            F.min(F.when(confirmed, F.col("settled_ms"))).alias("first_confirmed_settled_ms"),
            F.max("received_ms").alias("last_received_ms"),
            F.min(F.when(F.col("index") > 0, flag(F.col("delivery_count") > 0))).alias("later_all_declared"))
        if not self.sends_logged:
            return (delivered.withColumn("queue", F.col("delivered_queue"))
                    .withColumn("send_outcome", F.lit(None).cast("string"))
                    .withColumn("sent_ms", F.lit(None).cast("long"))
                    .withColumn("accepted_send", F.lit(True)))
        # a producer logs each identity once; should one appear twice, the node's acceptance wins
        sent = self.sends.groupBy(*IDENTITY).agg(
            F.max_by("queue", F.struct(*LOG_ORDER)).alias("send_queue"),
            F.when(F.max(flag(F.col("outcome") == "accepted")) == 1, F.lit("accepted"))
            .otherwise(F.max_by("outcome", F.struct(*LOG_ORDER))).alias("send_outcome"),
            F.min(F.when(F.col("outcome") == "accepted", F.col("sent_ms"))).alias("sent_ms"))
        return (delivered.join(sent, IDENTITY, "full_outer")
                .withColumn("queue", F.coalesce("send_queue", "delivered_queue"))
                .withColumn("accepted_send", F.coalesce(F.col("send_outcome") == "accepted", F.lit(False))))

    # ---- spread and latency: one rollup each, rows per (queue, consumer) and per queue ------------------

    def delivery_stats(self) -> DataFrame:
        """Rows per (queue, consumer) (`level` 0) and per queue (`level` 1).

        No distinct count over the deliveries: next to percentile_approx it makes Spark expand every
        line and build a percentile sketch per (consumer, group) (measured on 1 M deliveries: this
        step took 49 s of a 126 s audit, 25 s without). Groups are counted on a small (queue,
        consumer, group) aggregate and joined."""
        held = F.when((F.col("outcome") != "dropped") & F.col("settled_ms").isNotNull(),
                      F.col("settled_ms") - F.col("received_ms"))
        figures = [F.count(F.lit(1)).alias("deliveries"), F.sum(flag(F.col("accepted"))).alias("accepted"),
                   F.sum(flag(F.col("redelivery"))).alias("redeliveries"), *_percentiles(held, "receive_to_settle_ms")]
        held_groups = self.deliveries.select("queue", "consumer", "group").distinct()
        figured = self.deliveries.groupBy("queue", "consumer").agg(*figures).alias("figured")
        counted = held_groups.groupBy("queue", "consumer").agg(F.count(F.lit(1)).alias("groups")).alias("counted")
        by_consumer = (figured.join(counted, (F.col("figured.queue") == F.col("counted.queue"))  # a null consumer too
                                    & F.col("figured.consumer").eqNullSafe(F.col("counted.consumer")))
                       .select("figured.*", "counted.groups")
                       .withColumn("consumers", F.lit(1)).withColumn("level", F.lit(0)))
        by_queue = (self.deliveries.groupBy("queue").agg(*figures)
                    .join(held_groups.groupBy("queue").agg(F.countDistinct("group").alias("groups")), "queue")
                    .withColumn("consumers", F.lit(None).cast("long")).withColumn("level", F.lit(1)))
        return by_consumer.unionByName(by_queue.withColumn("consumer", F.lit(None).cast("string")))

    def identity_stats(self) -> DataFrame:
        """Per queue (`level` 1) the identities delivered and accepted and send to receive; the latter also
        per queue and first consumer (`level` 0)."""
        latency = F.col("first_received_ms") - F.col("sent_ms")
        delivered = F.col("lines").isNotNull()
        identities = self.identities.withColumnRenamed("first_consumer", "consumer")
        by_consumer = (identities.filter(F.col("sent_ms").isNotNull() & delivered).groupBy("queue", "consumer")
                       .agg(F.lit(0).alias("level"), *_percentiles(latency, "send_to_receive_ms")))
        by_queue = identities.groupBy("queue").agg(
            F.sum(flag(delivered)).alias("identities_delivered"),
            F.sum(F.coalesce("any_accepted", F.lit(0))).alias("delivered"), F.lit(1).alias("level"),
            *_percentiles(latency, "send_to_receive_ms"))
        return by_queue.withColumn("consumer", F.lit(None).cast("string")).unionByName(
            by_consumer, allowMissingColumns=True)

    def send_counts(self) -> DataFrame:
        return self.sends.groupBy("queue").agg(
            F.count(F.lit(1)).alias("lines"), F.sum(flag(F.col("outcome") == "accepted")).alias("accepted"),
            F.sum(flag(F.col("outcome").isin(*REFUSED_OUTCOMES))).alias("refused"),
            F.sum(flag(F.col("outcome") == "timeout")).alias("timed_out"))

    # ---- the report -----------------------------------------------------------------------------------

    def findings(self) -> DataFrame:
        """Every verdict and consumer change as (finding, queue, group, example); "change" counts them all,
        "change:REASON" by reason."""
        frames = [frame.select(F.lit(name).alias("finding"), "queue", "group", "example")
                  for name, frame in self.judged.frames().items()]
        changes = self.judged.consumer_changes()
        frames.append(changes.select(F.lit("change").alias("finding"), "queue", "group", "example"))
        frames.append(changes.select(F.concat(F.lit("change:"), "reason").alias("finding"), "queue", "group",
                                     "example"))
        return reduce(DataFrame.unionByName, frames)

    def report(self, files: LogFiles, kinds: dict[str, int], progress: AuditProgress) -> dict:
        try:
            progress.step("delivery statistics")
            delivery_stats = _rows(self.delivery_stats())
            progress.step("identity statistics")
            identity_stats = _rows(self.identity_stats())
            progress.step("send counts")
            sends = _rows(self.send_counts()) if self.sends_logged else []
            progress.step("findings")
            findings = _counted(self.findings())
            return audit_report.assemble(files=files, kinds=kinds, sends_logged=self.sends_logged,
                                         delivery_stats=delivery_stats, identity_stats=identity_stats,
                                         sends=sends, findings=findings)
        finally:
            self.unpersist()


def _percentiles(column, name: str) -> list:
    return [F.percentile_approx(column, list(PERCENTILES), PERCENTILE_ACCURACY).alias(name),
            F.max(column).alias(f"{name}_max")]


def _rows(frame: DataFrame) -> list[dict]:
    return [row.asDict(recursive=True) for row in frame.collect()]


def _counted(frame: DataFrame) -> list[dict]:
    """Per finding and queue: the count, the groups involved and the first examples (sorted)."""
    first = Window.partitionBy("finding", "queue").orderBy("example")
    return _rows(frame.withColumn("rank", F.row_number().over(first))
                 .groupBy("finding", "queue")
                 .agg(F.count(F.lit(1)).alias("count"), F.countDistinct("group").alias("groups"),
                      F.sort_array(F.collect_list(F.when(F.col("rank") <= EXAMPLES_MAX, F.col("example"))))
                      .alias("examples")))


# ---- running it ------------------------------------------------------------------------------------

def session(driver_memory: str = "4g", master: str = "local[*]") -> SparkSession:
    """A local Spark session bound to loopback (else Spark binds the machine's external interface)."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (SparkSession.builder.master(master).appName("grouper-audit")
             .config("spark.ui.enabled", "false").config("spark.driver.memory", driver_memory)
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run(log_paths: Iterable[str | Path], send_paths: Iterable[str | Path] = (), *, spark: SparkSession | None = None,
        json_path: str | Path | None = None, text_path: str | Path | None = None,
        png_path: str | Path | None = None, driver_memory: str = "4g") -> dict:
    """Audit the logs; write the JSON report, text summary and chart where asked; return the report."""
    files = LogFiles.of(log_paths, send_paths)
    owned = spark is None and SparkSession.getActiveSession() is None  # stopped here, once the report is made
    if spark is None:
        spark = session(driver_memory)
        if owned:
            spark.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions(files)))
    try:
        report = audit(spark, files)
    finally:
        if owned:
            spark.stop()
    if json_path is not None:
        audit_report.write_json(report, Path(json_path))
    if text_path is not None:
        Path(text_path).write_text(audit_report.summary(report) + "\n")
    if png_path is not None:
        audit_chart.draw(report, Path(png_path))
    return report
