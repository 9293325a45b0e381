"""Grouper's data pipeline on Apache Spark: the "grouper" data source (sink and source, batch and
streaming) and the delivery audit job (pipeline.audit).

    import pipeline
    pipeline.register(spark)                       # once per session: adds the "grouper" format
    pipeline.write_grouped(df, group="symbol", order_by="ts", nodes="127.0.0.1:5672", queue="orders")
    spark.read.format("grouper").option("nodes", ...).option("queue", "orders").load()

Importing this package imports neither pyspark nor proton; `register` and `write_grouped` do.
"""

from __future__ import annotations

FORMAT = "grouper"


def register(spark) -> None:
    """Make `format("grouper")` available in this Spark session (calling it again is harmless)."""
    if getattr(spark, "_grouper_registered", False):
        return  # registering again works too, but Spark logs a warning each time
    from pipeline.datasource import GrouperDataSource

    spark.dataSource.register(GrouperDataSource)
    spark._grouper_registered = True


def write_grouped(df, group: str, order_by, *, partitions: int | None = None, **options) -> None:
    """Write `df` so that every group's rows reach the queue in `order_by` order.

    Rows are repartitioned by the group column, so each group is written by exactly one task, and
    sorted within each partition by `order_by` (a column name, a Column, or a list of them; it
    should order each group's rows totally). `partitions` defaults to
    spark.sql.shuffle.partitions; `options` are the sink's options (nodes=..., queue=...)."""
    from pyspark.sql import functions

    lowered = {key.lower() for key in options}
    if "groupcolumn" in lowered:
        raise ValueError("write_grouped: give the group column as group=..., not as the groupColumn option")
    if group not in df.columns:
        raise ValueError(f"write_grouped: group={group!r} is not a column of the DataFrame; its columns are "
                         f"{', '.join(df.columns)}")
    order = list(order_by) if isinstance(order_by, (list, tuple)) else [order_by]
    if not order:
        raise ValueError("write_grouped: order_by needs at least one column (the order within each group)")
    register(df.sparkSession)
    key = functions.col(group)
    spread = df.repartition(partitions, key) if partitions else df.repartition(key)
    (spread.sortWithinPartitions(*order)
     .write.format(FORMAT).mode("append").option("groupColumn", group).options(**options).save())


def drained(spark, **options):
    """A context manager: `with pipeline.drained(spark, nodes=..., queue=...) as df:` gives the
    queue's messages as a DataFrame; they are accepted when the block succeeds and released, in
    order, if it raises. See pipeline.source.drained."""
    from pipeline.source import drained as drained_messages

    return drained_messages(spark, **options)
