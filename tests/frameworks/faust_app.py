"""A faust-streaming app: a Table of counts per word (in memory, backed by its compacted changelog topic, from
which a restarted worker recovers it); each count goes out to `fcounts` as "word:count"."""
import logging
import os
import sys

import faust

bootstrap = sys.argv.pop(1)
# FAUST_FETCH_LOG=PATH: aiokafka's fetcher and group coordinator log, at debug, to PATH: each fetch offset the client
# asks for, each record offset it takes in, each offset commit.
if os.environ.get("FAUST_FETCH_LOG"):
    trace = logging.FileHandler(os.environ["FAUST_FETCH_LOG"])
    trace.setFormatter(logging.Formatter("%(asctime)s %(process)d %(name)s %(message)s"))
    for name in ("aiokafka.consumer.fetcher", "aiokafka.consumer.group_coordinator"):
        logger = logging.getLogger(name)
        logger.setLevel(logging.DEBUG)
        logger.addHandler(trace)
        logger.propagate = False
app = faust.App("fcount", broker=f"kafka://{bootstrap}", store="memory://", topic_partitions=1,
                web_enabled=False, producer_acks=-1, broker_commit_every=10)
words = app.topic("fwords", key_serializer="raw", value_serializer="raw", partitions=1)
out = app.topic("fcounts", key_serializer="raw", value_serializer="raw", partitions=1)
counts = app.Table("counts", default=int, partitions=1)


@app.agent(words)
async def count(stream):
    async for raw in stream:
        word = raw.decode()
        counts[word] += 1
        await out.send(key=raw, value=f"{word}:{counts[word]}".encode())


if __name__ == "__main__":
    app.main()
