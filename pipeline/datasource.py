"""The "grouper" format: Spark's entry point to the sink and the source.

Rules:
- Options are parsed and column types checked here, on the driver, so bad input fails the
  query at once with one error naming the option; the writers and readers get parsed options.
- A queue cannot be overwritten: a write must use mode("append").
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSource

from pipeline.options import OptionError, parse_sink, parse_source
from pipeline.sink import GrouperStreamWriter, GrouperWriter, check_schema
from pipeline.source import GrouperReader, GrouperStreamReader, schema_text


class GrouperDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "grouper"

    def schema(self) -> str:
        # only bodyType shapes the schema; reader() and streamReader() check the mode against the rest
        return schema_text(parse_source({**self.options, "mode": "drain"}))

    def reader(self, schema) -> GrouperReader:
        return GrouperReader(parse_source(self.options))

    def streamReader(self, schema) -> GrouperStreamReader:
        mode = {key.lower(): value for key, value in self.options.items()}.get("mode", "drain")
        if str(mode).strip().lower() != "drain":
            raise OptionError("mode", f"{mode!r}: a streaming read always consumes, accepting each micro-batch "
                                      f"when Spark commits it; browse is for batch reads (leave mode out)")
        return GrouperStreamReader(parse_source({**self.options, "mode": "drain"}))

    def writer(self, schema, overwrite: bool) -> GrouperWriter:
        return GrouperWriter(self._sink_options(schema, overwrite))

    def streamWriter(self, schema, overwrite: bool) -> GrouperStreamWriter:
        return GrouperStreamWriter(self._sink_options(schema, overwrite))

    def _sink_options(self, schema, overwrite: bool):
        if overwrite:
            raise OptionError("mode", "a queue cannot be overwritten; write with mode('append') "
                                      "(streaming: outputMode('append'))")
        options = parse_sink(self.options)
        check_schema(options, schema)
        return options
