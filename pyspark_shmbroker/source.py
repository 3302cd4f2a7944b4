"""The data source Spark finds by itself: ``DefaultSource``, named "shmbroker".

pyspark >= 4.2 looks, in every new SparkSession, for top-level modules named ``pyspark_*`` that define
``DefaultSource`` and registers each under its ``name()``; so once this package is installed,
``spark.read.format("shmbroker")`` works with no registration call.

Invariants:
- Options are checked when the DataFrame is defined: ``schema()`` runs at ``load()`` and parses every
  source option, so an unknown or conflicting option fails there with a message naming it. Checks that
  depend on the kind of query (batch or streaming) run when the query is planned; sink options and
  columns when the write is planned. Nothing here contacts the node.
- The schema is Spark's Kafka source schema, headers included only with includeHeaders=true.
- Importing this module needs pyspark only. Spark's lookup of data sources imports the package in a
  Python worker; the modules that need kio, pyarrow and the rest are imported when the source is used,
  so a worker Python without them fails in the user's query with ``dependencies``' message naming the
  fix (an import error during the lookup only shows in a log warning, then as DATA_SOURCE_NOT_FOUND).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, DataSourceStreamWriter
from pyspark.sql.datasource import DataSourceWriter
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

if TYPE_CHECKING:
    from pyspark_shmbroker.options import SourceOptions

HEADERS_TYPE = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))


def kafka_schema(include_headers: bool) -> StructType:
    """The columns of Spark's Kafka source."""
    fields = [StructField("key", BinaryType()), StructField("value", BinaryType()),
              StructField("topic", StringType()), StructField("partition", IntegerType()),
              StructField("offset", LongType()), StructField("timestamp", TimestampType()),
              StructField("timestampType", IntegerType())]
    if include_headers:
        fields.append(StructField("headers", HEADERS_TYPE))
    return StructType(fields)


def _refuse_overwrite(overwrite: bool) -> None:
    from pyspark_shmbroker.options import OptionError

    if overwrite:
        raise OptionError("the shmbroker sink only appends to topics: use .mode('append') (a topic cannot be "
                          "overwritten)")


class DefaultSource(DataSource):
    """Topics of a shmbroker node (or any Kafka broker) as DataFrames, batch and streaming, read and write."""

    @classmethod
    def name(cls) -> str:
        return "shmbroker"

    def _source_options(self) -> SourceOptions:
        from pyspark_shmbroker.options import SourceOptions

        return SourceOptions.parse(self.options)

    def schema(self) -> StructType:
        return kafka_schema(self._source_options().include_headers)

    def reader(self, schema: StructType) -> DataSourceReader:
        options = self._source_options()
        options.check_batch()
        _check_schema(schema, options)
        from pyspark_shmbroker.reader import BatchReader

        return BatchReader(options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = self._source_options()
        options.check_streaming()
        _check_schema(schema, options)
        from pyspark_shmbroker.reader import StreamReader

        return StreamReader(options)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        _refuse_overwrite(overwrite)
        from pyspark_shmbroker.options import SinkOptions
        from pyspark_shmbroker.writer import ArrowWriter, RowWriter, SinkColumns

        options = SinkOptions.parse(self.options)
        columns = SinkColumns.check(schema, options)
        return ArrowWriter(options, columns) if options.use_arrow else RowWriter(options, columns)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        _refuse_overwrite(overwrite)
        from pyspark_shmbroker.options import SinkOptions
        from pyspark_shmbroker.writer import SinkColumns, StreamArrowWriter, StreamRowWriter

        options = SinkOptions.parse(self.options)
        columns = SinkColumns.check(schema, options)
        return StreamArrowWriter(options, columns) if options.use_arrow else StreamRowWriter(options, columns)


def _check_schema(schema: StructType, options: SourceOptions) -> None:
    from pyspark_shmbroker.options import OptionError

    expected = kafka_schema(options.include_headers)
    if [(f.name, f.dataType) for f in schema.fields] != [(f.name, f.dataType) for f in expected.fields]:
        raise OptionError(f"the shmbroker source's schema is fixed (Spark's Kafka source schema): "
                          f"{expected.simpleString()}; a user schema {schema.simpleString()} cannot be read")
