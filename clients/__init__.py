"""Client-side code of shmbroker, apart from the server: the priority producer and consumer (``priority``,
over confluent-kafka) and the Kafka wire module (``wire``, over kio) that the Spark connector, the benchmarks
and the tests speak through. It imports nothing of the node, nor of the connector: importing it never
imports pyspark."""
