// A stateful Kafka Streams application with exactly-once processing, against a node (or Kafka), one run:
//   java -cp <Kafka's jars>:<ClientKit> tests/java/StreamsApp.java bootstrap=<host:port> app=<application.id>
//        state=<state dir> input=<topic> counts=<topic> amounts=<topic> windows=<topic> protocol=<classic|streams>
//        expect=<records per output topic> deadline-s=<seconds> [throttle-ms=<ms per record>]
//        [topic.<config>=<value> ...: configs of the internal topics]
// The input's records are <user> -> <amount> (a decimal), written before (tests/test_kafka_streams.py). Three
// branches of one topology, processing.guarantee=exactly_once_v2, no record cache (every update is an output
// record, so each output key's values are a known sequence):
//   counts:  records per user, a persistent (RocksDB) store "counts" and its changelog topic;
//   amounts: records per amount: re-keyed by the amount, so a repartition topic, then the store "amount-counts";
//   windows: the sum of the amounts per user in 60 s tumbling windows (grace one hour), the window store
//            "window-sums", keyed "<user>@<window start ms>".
// Outputs are Strings. A read_committed consumer of the three output topics (the watcher) counts their records;
// the run ends when each holds `expect` (its outputs are complete) or at the deadline, and Streams closes,
// leaving its group. JSON lines, one per event, each with "ms" since the program's start: "state" on each change
// of Streams' state, "restored" for each store partition restored from its changelog (records), "progress" as
// the committed outputs grow, "error" for an exception of a stream thread, then "complete" or "incomplete" (the
// deadline passed, or Streams stopped on an error), and "closed". Every wait is bounded.
// A line "hold" on its standard input: the first stream thread to output a count afterwards stops right after
// handing it to its producer, inside its transaction (it cannot commit while stopped), and says so ("held");
// the tests then SIGKILL the JVM with that transaction open and its records at the broker.
import java.time.Duration;
import java.util.*;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.atomic.AtomicBoolean;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.CloseOptions;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.*;
import org.apache.kafka.streams.processor.StateRestoreListener;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.WindowStore;

public class StreamsApp {
    static final long STARTED = System.currentTimeMillis();
    static final Duration WINDOW = Duration.ofSeconds(60);
    static final Duration GRACE = Duration.ofHours(1);
    static final long PROGRESS_EVERY_MS = 100;
    static final Duration CLOSE_TIMEOUT = Duration.ofSeconds(30);
    static final long HOLD_MAX_MS = 60_000;  // a held stream thread goes on after this (the tests kill it first)
    static final CountDownLatch HOLD_ASKED = new CountDownLatch(1);
    static final AtomicBoolean HELD = new AtomicBoolean();

    static void emit(String step, Object... pairs) {
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("step", step);
        line.put("ms", System.currentTimeMillis() - STARTED);
        line.putAll(ClientKit.pairs(pairs));
        ClientKit.print(line);
    }

    public static void main(String[] argv) throws Exception {
        Map<String, String> args = new HashMap<>();
        for (String arg : argv) {
            int eq = arg.indexOf('=');
            if (eq < 0) throw new IllegalArgumentException("not key=value: " + arg);
            args.put(arg.substring(0, eq), arg.substring(eq + 1));
        }
        String bootstrap = args.get("bootstrap"), protocol = args.get("protocol");
        List<String> outputs = List.of(args.get("counts"), args.get("amounts"), args.get("windows"));
        long expect = Long.parseLong(args.get("expect"));
        long deadline = System.currentTimeMillis() + 1000 * Long.parseLong(args.get("deadline-s"));
        long throttleMs = Long.parseLong(args.getOrDefault("throttle-ms", "0"));

        Properties props = config(bootstrap, args.get("app"), args.get("state"), protocol);
        // topic.<config>=<value>: a config of the internal topics Streams makes (its changelogs, repartitions).
        args.forEach((key, value) -> {
            if (key.startsWith(StreamsConfig.TOPIC_PREFIX)) props.put(key, value);
        });
        KafkaStreams streams = new KafkaStreams(topology(args.get("input"), outputs, throttleMs), props);
        streams.setStateListener((now, before) -> emit("state", "state", now.name()));
        streams.setGlobalStateRestoreListener(new StateRestoreListener() {
            public void onRestoreStart(TopicPartition tp, String store, long start, long end) {}

            public void onBatchRestored(TopicPartition tp, String store, long batchEnd, long batchRecords) {}

            public void onRestoreEnd(TopicPartition tp, String store, long totalRestored) {
                emit("restored", "store", store, "changelog", tp.toString(), "records", totalRestored);
            }
        });
        streams.setUncaughtExceptionHandler(e -> {
            emit("error", "error", e.toString(), "cause", String.valueOf(e.getCause()));
            return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        Thread commands = new Thread(StreamsApp::readCommands, "commands");
        commands.setDaemon(true);
        commands.start();
        streams.start();
        Map<String, Long> committed = watch(bootstrap, outputs, expect, deadline, streams);
        boolean complete = committed.values().stream().allMatch(n -> n >= expect);
        emit(complete ? "complete" : "incomplete", "committed", committed, "state", streams.state().name());
        boolean closed = streams.close(CloseOptions.groupMembershipOperation(
                CloseOptions.GroupMembershipOperation.LEAVE_GROUP).withTimeout(CLOSE_TIMEOUT));
        emit("closed", "clean", closed);
    }

    static Properties config(String bootstrap, String app, String stateDir, String protocol) {
        Properties props = new Properties();
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, app);
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
        props.put(StreamsConfig.GROUP_PROTOCOL_CONFIG, protocol);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 2);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);  // every update an output record
        // The repartition topic's consumed records deleted (DeleteRecords) after a commit at most this long after
        // the last (30 s by default: never, in a run this short).
        props.put(StreamsConfig.REPARTITION_PURGE_INTERVAL_MS_CONFIG, 200);
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        // Records leave as they are made, not at the commit (Streams' producer waits up to 100 ms, its commit
        // interval): a kill finds the open transaction's records at the broker, for the restart to abort.
        props.put(StreamsConfig.producerPrefix("linger.ms"), 5);
        if (protocol.equals("classic")) {
            // The group's least session timeout: a killed instance's members leave the group soon, so the
            // restarted one's rebalance does not wait 45 s for them (the streams protocol's is the broker's).
            props.put(StreamsConfig.consumerPrefix("session.timeout.ms"), 6000);
            props.put(StreamsConfig.consumerPrefix("heartbeat.interval.ms"), 1000);
        }
        return props;
    }

    static org.apache.kafka.streams.Topology topology(String input, List<String> outputs, long throttleMs) {
        StreamsBuilder builder = new StreamsBuilder();
        KStream<String, String> source = builder.<String, String>stream(input).peek((user, amount) -> {
            if (throttleMs > 0) sleep(throttleMs);  // a long run, so a SIGKILL lands inside a transaction
        });
        Produced<String, String> strings = Produced.with(Serdes.String(), Serdes.String());

        KStream<String, String> counts = source.groupByKey()
                .count(Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as("counts"))
                .toStream().mapValues(String::valueOf);
        counts.to(outputs.get(0), strings);
        counts.peek(StreamsApp::holdIfAsked);  // after to(): a node forwards to its children in their order

        source.selectKey((user, amount) -> "amount-" + amount)
                .groupByKey(Grouped.as("by-amount"))
                .count(Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as("amount-counts"))
                .toStream().mapValues(String::valueOf).to(outputs.get(1), strings);

        source.groupByKey()
                .windowedBy(TimeWindows.ofSizeAndGrace(WINDOW, GRACE))
                .aggregate(() -> 0L, (user, amount, sum) -> sum + Long.parseLong(amount),
                        Materialized.<String, Long, WindowStore<Bytes, byte[]>>as("window-sums")
                                .withValueSerde(Serdes.Long()))
                .toStream((window, sum) -> window.key() + "@" + window.window().start())
                .mapValues(String::valueOf).to(outputs.get(2), strings);
        return builder.build();
    }

    static void readCommands() {
        try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in))) {
            for (String line; (line = in.readLine()) != null; ) {
                if (line.trim().equals("hold")) HOLD_ASKED.countDown();
            }
        } catch (Exception e) {
            emit("error", "error", "reading commands: " + e);
        }
    }

    /** Once "hold" was asked, the first count output stops its stream thread (for HOLD_MAX_MS at most). */
    static void holdIfAsked(String user, String count) {
        if (HOLD_ASKED.getCount() == 0 && HELD.compareAndSet(false, true)) {
            emit("held", "thread", Thread.currentThread().getName(), "key", user, "count", count);
            sleep(HOLD_MAX_MS);
        }
    }

    static void sleep(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    /** The records each output topic holds as read_committed, read until each has `expect`, Streams stopped
     * running (an error), or the deadline; "progress" lines as they grow. */
    static Map<String, Long> watch(String bootstrap, List<String> outputs, long expect, long deadline,
                                   KafkaStreams streams) {
        Map<String, Object> config = Map.of("bootstrap.servers", bootstrap,
                "key.deserializer", StringDeserializer.class.getName(),
                "value.deserializer", StringDeserializer.class.getName(),
                "isolation.level", "read_committed", "enable.auto.commit", false);
        Map<String, Long> counts = new TreeMap<>();
        try (KafkaConsumer<String, String> watcher = new KafkaConsumer<>(config)) {
            List<TopicPartition> partitions = new ArrayList<>();
            for (String topic : outputs) {
                counts.put(topic, 0L);
                for (PartitionInfo info : watcher.partitionsFor(topic, Duration.ofMillis(deadline
                        - System.currentTimeMillis()))) {
                    partitions.add(new TopicPartition(topic, info.partition()));
                }
            }
            watcher.assign(partitions);
            watcher.seekToBeginning(partitions);
            long lastProgress = 0;
            Map<String, Long> shown = new TreeMap<>(counts);
            while (System.currentTimeMillis() < deadline
                    && !counts.values().stream().allMatch(n -> n >= expect)
                    && streams.state() != KafkaStreams.State.ERROR
                    && streams.state() != KafkaStreams.State.PENDING_ERROR
                    && streams.state() != KafkaStreams.State.NOT_RUNNING) {
                for (ConsumerRecord<String, String> r : watcher.poll(Duration.ofMillis(100))) {
                    counts.merge(r.topic(), 1L, Long::sum);
                }
                long now = System.currentTimeMillis();
                if (!counts.equals(shown) && now - lastProgress >= PROGRESS_EVERY_MS) {
                    emit("progress", "committed", counts);
                    shown = new TreeMap<>(counts);
                    lastProgress = now;
                }
            }
        }
        return counts;
    }
}
