"""What the benchmarks, the report jobs and the tests share: nodeproc (the one launcher of a real node),
rawkafka (the raw Kafka protocol client of the load generators), benchnode (the node under test, pipelined
requests, result rows, CPU meters), abba (alternating rounds of two modes and their ratio), results (the
results record format of the report job, `python -m scripts.harness.results publish ...`) and sparkjob (a
SparkSession for the Spark jobs and tests)."""
