"""pyspark_shmbroker: the Spark connector of shmbroker, written with Spark's Python Data Source API.

Installed with ``pip install 'shmbroker[spark]'``; Spark (pyspark >= 4.2) finds ``DefaultSource`` by
itself, so ``spark.read.format("shmbroker")``, ``spark.readStream``, ``df.write`` and ``df.writeStream``
work in any new SparkSession. Modules: ``source`` (DefaultSource, schema), ``options`` (every option,
checked), ``reader`` (batch and streaming reads), ``writer`` and ``producer`` (writes, the idempotent
producer), ``records`` (record batches into Arrow), ``offsets`` (offset resolution, ranges, read
limits), ``dependencies`` (kio, pyarrow and the rest, or an error saying how to run Spark with the
Python that has them). It speaks Kafka's protocol through ``shmbroker.clients.wire`` (kio). A client
package: of the node it imports only the record-batch codec.

Importing the package needs pyspark only (see ``source``): Spark's Python workers must run a Python that
has the dependencies too (PYSPARK_PYTHON, or the venv activated), and one that lacks them fails when the
source is used, with a message saying so.
"""

import logging

from pyspark_shmbroker.source import DefaultSource, kafka_schema

# Commit reports go out at INFO; a library adds no handler, so they show where logging is configured
# (Spark's python_worker_logs, or the application's own handlers).
if logging.getLogger("pyspark_shmbroker").level == logging.NOTSET:
    logging.getLogger("pyspark_shmbroker").setLevel(logging.INFO)

__all__ = ["DefaultSource", "kafka_schema"]
