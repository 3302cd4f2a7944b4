// A small stateful Kafka Streams application with group.protocol=streams (KIP-1071) against a node or a Kafka:
//   java -cp <Kafka's jars> tests/java/StreamsGroupApp.java <bootstrap> <prefix> <state dir> <restart|no-restart>
// The topology counts words: subtopology 0 re-keys <prefix>-in by value into a repartition topic, subtopology 1
// counts per word in a store (with its changelog) and writes the counts to <prefix>-out. Steps, one JSON line each
// ({"step": ...}): the admin sets the group's streams.num.standby.replicas to 1 (incrementalAlterConfigs on the GROUP
// resource; a value above the broker's maximum refused) and describes it; two instances share the tasks, each
// holding the other's stateful tasks as standby; the counts are right; the admin describes the group; one instance
// leaves and the other takes every task; the counts go on. With `restart` the program prints "before-restart",
// waits for a line on stdin (the test restarts the node meanwhile) and checks the group and the counts after it.
// Last, once the instance closed: the group's committed offsets (listStreamsGroupOffsets) and its deletion.
// Every wait is bounded (WAIT_MS).
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.time.Duration;
import java.util.*;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.streams.*;
import org.apache.kafka.streams.kstream.*;
import org.apache.kafka.streams.processor.TaskId;

public class StreamsGroupApp {
    static final long WAIT_MS = 60_000;
    static final int PARTITIONS = 4;
    static final List<String> WORDS = List.of("alpha", "beta", "gamma", "delta", "epsilon", "zeta");
    static final ObjectMapper JSON = new ObjectMapper();
    static String bootstrap, prefix, app, stateDir;

    public static void main(String[] args) throws Exception {
        bootstrap = args[0];
        prefix = args[1];
        stateDir = args[2];
        boolean restart = args[3].equals("restart");
        app = prefix + "-app";
        try (Admin admin = Admin.create(Map.of("bootstrap.servers", bootstrap))) {
            admin.createTopics(List.of(new NewTopic(prefix + "-in", PARTITIONS, (short) 1),
                    new NewTopic(prefix + "-out", 1, (short) 1), new NewTopic(prefix + "-eos-out", 1, (short) 1)))
                    .all().get();
            emit("group-config", "result", groupConfig(admin));
        }
        KafkaStreams a = start("a"), b = start("b");
        waitFor("two instances share every task, each with the other's stateful ones as standby",
                () -> running(a) && running(b) && tasks(a).size() + tasks(b).size() == 2 * PARTITIONS
                        && !tasks(a).isEmpty() && !tasks(b).isEmpty() && disjoint(tasks(a), tasks(b))
                        && standbys(a).equals(stateful(tasks(b))) && standbys(b).equals(stateful(tasks(a))));
        emit("two-instances", "a", tasks(a), "b", tasks(b), "standbyA", standbys(a), "standbyB", standbys(b));
        produceRound(1);
        emit("counts", "counts", waitCounts(1));
        emit("describe", "group", describe());
        b.close(Duration.ofMillis(WAIT_MS));
        waitFor("the instance left takes every task", () -> running(a) && tasks(a).size() == 2 * PARTITIONS);
        emit("one-left", "a", tasks(a));
        produceRound(2);
        emit("counts-after-leave", "counts", waitCounts(2));
        if (restart) {
            Map<String, Object> before = describe();
            emit("before-restart", "group", before);
            new BufferedReader(new InputStreamReader(System.in)).readLine();
            produceRound(3);
            emit("counts-after-restart", "counts", waitCounts(3));
            waitFor("the instance has every task after the restart",
                    () -> running(a) && tasks(a).size() == 2 * PARTITIONS);
            emit("after-restart", "a", tasks(a), "group", describe());
        }
        a.close(Duration.ofMillis(WAIT_MS));
        // The same count with exactly_once_v2: offsets committed in transactions (TxnOffsetCommit at the member's
        // epoch), the output read read_committed.
        KafkaStreams eos = start("eos", prefix + "-eos-app", prefix + "-eos-out", StreamsConfig.EXACTLY_ONCE_V2);
        int rounds = restart ? 3 : 2;
        waitFor("the exactly-once instance runs every task", () -> running(eos) && tasks(eos).size() == 2 * PARTITIONS);
        emit("exactly-once", "counts", waitCounts(prefix + "-eos-out", rounds, "read_committed"));
        eos.close(Duration.ofMillis(WAIT_MS));
        try (Admin admin = Admin.create(Map.of("bootstrap.servers", bootstrap))) {
            // The group's committed offsets (input and repartition topics), then the empty group deleted.
            Map<String, Long> committed = new TreeMap<>();
            var offsets = admin.listStreamsGroupOffsets(Map.of(app, new ListStreamsGroupOffsetsSpec()));
            offsets.partitionsToOffsetAndMetadata(app).get()
                    .forEach((tp, offset) -> committed.put(tp.toString(), offset == null ? null : offset.offset()));
            emit("offsets", "committed", committed);
            admin.deleteStreamsGroups(List.of(app)).all().get();
            String after;
            try {
                admin.describeStreamsGroups(List.of(app)).all().get();
                after = "described";
            } catch (java.util.concurrent.ExecutionException e) {
                after = e.getCause().getClass().getSimpleName();
            }
            emit("deleted", "describeAfter", after);
        }
        emit("done");
    }

    static KafkaStreams start(String name) {
        return start(name, app, prefix + "-out", StreamsConfig.AT_LEAST_ONCE);
    }

    static KafkaStreams start(String name, String appId, String output, String guarantee) {
        StreamsBuilder builder = new StreamsBuilder();
        builder.<String, String>stream(prefix + "-in")
                .groupBy((key, value) -> value)
                .count(Materialized.as("counts"))
                .toStream()
                .mapValues(count -> Long.toString(count))
                .to(output);
        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, guarantee);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(StreamsConfig.GROUP_PROTOCOL_CONFIG, "streams");
        props.put(StreamsConfig.STATE_DIR_CONFIG, stateDir + "/" + name);
        props.put(StreamsConfig.CLIENT_ID_CONFIG, prefix + "-" + name);
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, 1);
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, 100);
        props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, 0);
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class);
        props.put(StreamsConfig.consumerPrefix(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG), "earliest");
        KafkaStreams streams = new KafkaStreams(builder.build(), props);
        streams.start();
        return streams;
    }

    static boolean running(KafkaStreams streams) {
        return streams.state() == KafkaStreams.State.RUNNING;
    }

    static List<String> tasks(KafkaStreams streams) {
        List<String> tasks = new ArrayList<>();
        for (var thread : streams.metadataForLocalThreads()) {
            for (var task : thread.activeTasks()) tasks.add(task.taskId().toString());
        }
        Collections.sort(tasks);
        return tasks;
    }

    static List<String> standbys(KafkaStreams streams) {
        List<String> tasks = new ArrayList<>();
        for (var thread : streams.metadataForLocalThreads()) {
            for (var task : thread.standbyTasks()) tasks.add(task.taskId().toString());
        }
        Collections.sort(tasks);
        return tasks;
    }

    /** The tasks of subtopology 1, the one with a store (so a changelog): the only ones with standby replicas. */
    static List<String> stateful(List<String> tasks) {
        List<String> kept = new ArrayList<>();
        for (String task : tasks) if (task.startsWith("1_")) kept.add(task);
        return kept;
    }

    /** streams.num.standby.replicas=1 for the application's group (before it exists), a refused 3 (above
     *  group.streams.max.standby.replicas, 2), and the group's streams.* configs as DescribeConfigs shows them. */
    static Map<String, Object> groupConfig(Admin admin) throws Exception {
        ConfigResource group = new ConfigResource(ConfigResource.Type.GROUP, app);
        Map<String, Object> out = new LinkedHashMap<>();
        try {
            admin.incrementalAlterConfigs(Map.of(group, List.of(new AlterConfigOp(
                    new ConfigEntry("streams.num.standby.replicas", "3"), AlterConfigOp.OpType.SET)))).all().get();
            out.put("three", "accepted");
        } catch (java.util.concurrent.ExecutionException e) {
            out.put("three", e.getCause().getClass().getSimpleName());
        }
        admin.incrementalAlterConfigs(Map.of(group, List.of(new AlterConfigOp(
                new ConfigEntry("streams.num.standby.replicas", "1"), AlterConfigOp.OpType.SET)))).all().get();
        // Kafka applies an altered config through its metadata log: a describe right after may not show it yet.
        waitFor("the group config is described", () -> "1".equals(admin.describeConfigs(List.of(group)).all().get()
                .get(group).get("streams.num.standby.replicas").value()));
        Config described = admin.describeConfigs(List.of(group)).all().get().get(group);
        Map<String, Object> configs = new TreeMap<>();
        for (String name : List.of("streams.num.standby.replicas", "streams.session.timeout.ms",
                "streams.heartbeat.interval.ms")) {
            ConfigEntry entry = described.get(name);
            configs.put(name, entry == null ? null : entry.value() + " " + entry.source());
        }
        out.put("configs", configs);
        return out;
    }

    static boolean disjoint(List<String> one, List<String> other) {
        return Collections.disjoint(one, other);
    }

    static void produceRound(int round) throws Exception {
        Map<String, Object> config = Map.of("bootstrap.servers", bootstrap,
                "key.serializer", StringSerializer.class.getName(),
                "value.serializer", StringSerializer.class.getName(), "linger.ms", 0);
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(config)) {
            for (int i = 0; i < WORDS.size(); i++) {
                for (int copy = 0; copy <= i; copy++) {  // word i appears i + 1 times per round
                    producer.send(new ProducerRecord<>(prefix + "-in", "r" + round + "-" + i + "-" + copy,
                            WORDS.get(i))).get();
                }
            }
        }
    }

    /** The latest count per word in the output topic once every word reached `rounds` times its share. */
    static Map<String, Long> waitCounts(int rounds) throws Exception {
        return waitCounts(prefix + "-out", rounds, "read_uncommitted");
    }

    static Map<String, Long> waitCounts(String output, int rounds, String isolation) throws Exception {
        Map<String, Object> config = Map.of("bootstrap.servers", bootstrap,
                "key.deserializer", StringDeserializer.class.getName(),
                "value.deserializer", StringDeserializer.class.getName(),
                "auto.offset.reset", "earliest", "enable.auto.commit", false, "isolation.level", isolation);
        Map<String, Long> latest = new TreeMap<>();
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(config)) {
            consumer.assign(List.of(new TopicPartition(output, 0)));  // no group: no rebalance to wait for
            long deadline = System.currentTimeMillis() + WAIT_MS;
            while (System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(200))) {
                    latest.put(record.key(), Long.parseLong(record.value()));
                }
                boolean complete = true;
                for (int i = 0; i < WORDS.size(); i++) {
                    complete &= latest.getOrDefault(WORDS.get(i), 0L) >= (long) rounds * (i + 1);
                }
                if (complete) return latest;
            }
        }
        throw new IllegalStateException("counts not reached in time: " + latest);
    }

    static Map<String, Object> describe() throws Exception {
        try (Admin admin = Admin.create(Map.of("bootstrap.servers", bootstrap))) {
            StreamsGroupDescription group = admin.describeStreamsGroups(List.of(app)).all().get().get(app);
            Map<String, Object> out = new LinkedHashMap<>();
            out.put("state", group.groupState().toString());
            out.put("groupEpoch", group.groupEpoch());
            out.put("assignmentEpoch", group.targetAssignmentEpoch());
            out.put("topologyEpoch", group.topologyEpoch());
            List<Object> subtopologies = new ArrayList<>();
            for (var sub : group.subtopologies()) {
                subtopologies.add(Map.of("id", sub.subtopologyId(), "sources", new TreeSet<>(sub.sourceTopics()),
                        "repartitionSinks", new TreeSet<>(sub.repartitionSinkTopics()),
                        "changelogs", new TreeSet<>(sub.stateChangelogTopics().keySet()),
                        "repartitionSources", new TreeSet<>(sub.repartitionSourceTopics().keySet())));
            }
            subtopologies.sort(Comparator.comparing(s -> (String) ((Map<?, ?>) s).get("id")));
            out.put("subtopologies", subtopologies);
            List<Object> members = new ArrayList<>();
            for (var member : group.members()) {
                List<String> active = new ArrayList<>();
                for (var ids : member.assignment().activeTasks()) {
                    for (int partition : ids.partitions()) active.add(ids.subtopologyId() + "_" + partition);
                }
                Collections.sort(active);
                List<String> standby = new ArrayList<>();
                for (var ids : member.assignment().standbyTasks()) {
                    for (int partition : ids.partitions()) standby.add(ids.subtopologyId() + "_" + partition);
                }
                Collections.sort(standby);
                members.add(Map.of("clientId", member.clientId(), "memberEpoch", member.memberEpoch(),
                        "active", active, "standby", standby));
            }
            members.sort(Comparator.comparing(m -> (String) ((Map<?, ?>) m).get("clientId")));
            out.put("members", members);
            return out;
        }
    }

    interface Check { boolean ok() throws Exception; }

    static void waitFor(String what, Check check) throws Exception {
        long deadline = System.currentTimeMillis() + WAIT_MS;
        while (System.currentTimeMillis() < deadline) {
            if (check.ok()) return;
            Thread.sleep(100);
        }
        throw new IllegalStateException("not in time: " + what);
    }

    static void emit(String step, Object... pairs) throws Exception {
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("step", step);
        for (int i = 0; i < pairs.length; i += 2) line.put((String) pairs[i], pairs[i + 1]);
        System.out.println(JSON.writeValueAsString(line));
        System.out.flush();
    }
}
