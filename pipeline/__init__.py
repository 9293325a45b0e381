"""Grouper's data pipeline on Apache Spark: a source and sink for grouped queues, and the delivery audit job."""
