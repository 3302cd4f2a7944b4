"""A quixstreams stateful app: per word, the count in a tumbling window of an hour (its state in RocksDB,
backed by a compacted changelog topic the app creates), sent to `counts` as {"word", "count"}."""
import sys

from quixstreams import Application

bootstrap, state_dir, group = sys.argv[1], sys.argv[2], sys.argv[3]
app = Application(broker_address=bootstrap, consumer_group=group, auto_offset_reset="earliest", state_dir=state_dir,
                  commit_interval=0.5, loglevel="WARNING")
words = app.topic("words", value_deserializer="json", key_deserializer="str")
counts = app.topic("counts", value_serializer="json", key_serializer="str")
sdf = app.dataframe(words)
sdf = sdf.tumbling_window(duration_ms=3_600_000).count().current()
sdf = sdf.apply(lambda window, key, timestamp, headers: {"word": key, "count": window["value"]}, metadata=True)
sdf.to_topic(counts)

if __name__ == "__main__":
    app.run()
