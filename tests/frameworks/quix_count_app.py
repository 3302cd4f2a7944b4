"""A quixstreams stateful app: a running count per key (its state in RocksDB, backed by a changelog topic the app
creates), each record's count sent to the output topic as {"word", "count"}.

    quix_count_app.py BOOTSTRAP STATE_DIR GROUP GUARANTEE INPUT OUTPUT TRANSACTION_TIMEOUT_MS

GUARANTEE is quixstreams' processing_guarantee ("exactly-once" or "at-least-once"). Under exactly-once a
checkpoint is one transaction: the output, the changelog and the input offsets are committed together, so a
read_committed reader of the output sees each key's counts 1, 2, 3, ... with no repeat and no gap, however the
app was killed. The transactional.id is quixstreams' own (random per start): a killed app's open transaction is
aborted by the broker once TRANSACTION_TIMEOUT_MS has passed; its member leaves the group after the minimum
session timeout."""
import sys

from quixstreams import Application

bootstrap, state_dir, group, guarantee, source, sink, transaction_timeout_ms = sys.argv[1:8]
app = Application(broker_address=bootstrap, consumer_group=group, auto_offset_reset="earliest", state_dir=state_dir,
                  commit_interval=0.5, loglevel="WARNING", processing_guarantee=guarantee,
                  producer_extra_config={"transaction.timeout.ms": int(transaction_timeout_ms)},
                  # A killed app's member leaves the group after this, so its restart is not held longer.
                  consumer_extra_config={"session.timeout.ms": 6000})
words = app.topic(source, value_deserializer="json", key_deserializer="str")
counts = app.topic(sink, value_serializer="json", key_serializer="str")


def count(value: dict, state) -> dict:
    total = state.get("count", 0) + 1
    state.set("count", total)
    return {"word": value["word"], "count": total}


app.dataframe(words).apply(count, stateful=True).to_topic(counts)

if __name__ == "__main__":
    app.run()
