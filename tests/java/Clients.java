// Apache Kafka's Java producer and consumer against a node, one scenario per run:
//   java -cp <Kafka's jars>:<ClientKit> tests/java/Clients.java <scenario> <bootstrap> <prefix>
// Each step prints one JSON line {"step": ..., ...}; tests/test_java_clients.py asserts on them. Every wait is
// bounded (WAIT_MS); the names of topics and groups start with <prefix>.
import java.time.Duration;
import java.util.*;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.TopicPartition;

public class Clients {
    static final long WAIT_MS = 30_000;
    static String bootstrap;
    static String prefix;

    public static void main(String[] args) throws Exception {
        bootstrap = args[1];
        prefix = args[2];
        switch (args[0]) {
            case "transactions" -> transactions();
            case "groups" -> groups();
            case "static" -> staticMembership(args.length > 3 ? args[3] : "classic");
            case "cooperative" -> cooperative();
            default -> throw new IllegalArgumentException("no scenario " + args[0]);
        }
    }

    static void emit(String step, Object... pairs) {
        ClientKit.emit(step, pairs);
    }

    static void createTopic(String name, int partitions) throws Exception {
        try (Admin admin = Admin.create(Map.of("bootstrap.servers", bootstrap))) {
            admin.createTopics(List.of(new NewTopic(name, partitions, (short) 1))).all().get();
        }
    }

    static KafkaProducer<String, String> producer(Map<String, Object> more) {
        return ClientKit.producer(bootstrap, more);
    }

    static KafkaConsumer<String, String> consumer(Map<String, Object> more) {
        return ClientKit.consumer(bootstrap, more);
    }

    /** Records as [partition, offset, key, value], polled until `count` came or WAIT_MS passed. */
    static List<List<Object>> pollRecords(Consumer<String, String> consumer, int count) {
        List<List<Object>> got = new ArrayList<>();
        long deadline = System.currentTimeMillis() + WAIT_MS;
        while (got.size() < count && System.currentTimeMillis() < deadline) {
            for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(200))) {
                got.add(List.of(r.partition(), r.offset(), String.valueOf(r.key()), r.value()));
            }
        }
        return got;
    }

    /** Every record of the partition from its start to its end offset now, read by a consumer of no group. */
    static List<List<Object>> readAll(TopicPartition tp, String isolation) {
        try (KafkaConsumer<String, String> reader = consumer(Map.of("isolation.level", isolation))) {
            reader.assign(List.of(tp));
            reader.seekToBeginning(List.of(tp));
            long end = reader.endOffsets(List.of(tp)).get(tp);
            List<List<Object>> got = new ArrayList<>();
            long deadline = System.currentTimeMillis() + WAIT_MS;
            while (reader.position(tp) < end && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, String> r : reader.poll(Duration.ofMillis(200))) {
                    got.add(List.of(r.offset(), r.value()));
                }
            }
            return got;
        }
    }

    static List<String> sendAll(Producer<String, String> producer, String topic, int partition, List<String> values)
            throws Exception {
        List<java.util.concurrent.Future<RecordMetadata>> sent = new ArrayList<>();
        for (String value : values) sent.add(producer.send(new ProducerRecord<>(topic, partition, value, value)));
        List<String> where = new ArrayList<>();
        for (var future : sent) where.add(future.get().toString());
        return where;
    }

    static List<String> values(String stem, int count) {
        List<String> out = new ArrayList<>();
        for (int i = 0; i < count; i++) out.add(stem + "-" + i);
        return out;
    }

    // ---------------------------------------------------------------- producers, transactions, read_committed

    static void transactions() throws Exception {
        String input = prefix + "-in", output = prefix + "-out", group = prefix + "-group";
        createTopic(input, 1);
        createTopic(output, 1);
        TopicPartition in0 = new TopicPartition(input, 0), out0 = new TopicPartition(output, 0);
        try (KafkaProducer<String, String> idempotent = producer(Map.of("enable.idempotence", true, "acks", "all",
                "max.in.flight.requests.per.connection", 5))) {
            emit("idempotent", "sent", sendAll(idempotent, input, 0, values("in", 6)));
        }
        emit("idempotent-read", "records", readAll(in0, "read_uncommitted"));

        try (KafkaConsumer<String, String> source = consumer(Map.of("group.id", group,
                "isolation.level", "read_committed"));
             KafkaProducer<String, String> tx = producer(Map.of("transactional.id", prefix + "-tx"))) {
            source.subscribe(List.of(input));
            List<List<Object>> consumed = pollRecords(source, 6);
            emit("source", "records", consumed);
            tx.initTransactions();
            tx.beginTransaction();
            sendAll(tx, output, 0, values("aborted", 3));
            tx.sendOffsetsToTransaction(Map.of(in0, new OffsetAndMetadata(3)), source.groupMetadata());
            tx.abortTransaction();
            emit("after-abort", "committed", offsetOf(source.committed(Set.of(in0)).get(in0)));
            tx.beginTransaction();
            sendAll(tx, output, 0, values("committed", 6));
            tx.sendOffsetsToTransaction(Map.of(in0, new OffsetAndMetadata(6)), source.groupMetadata());
            tx.commitTransaction();
            emit("after-commit", "committed", offsetOf(source.committed(Set.of(in0)).get(in0)));
            // A new producer of the same transactional id fences the old one.
            try (KafkaProducer<String, String> successor = producer(Map.of("transactional.id", prefix + "-tx"))) {
                successor.initTransactions();
                String fenced = "not fenced";
                try {
                    tx.beginTransaction();
                    sendAll(tx, output, 0, values("zombie", 1));
                    tx.commitTransaction();
                } catch (Exception e) {
                    // The send's future wraps the error in an ExecutionException; commitTransaction throws it.
                    Throwable cause = e instanceof java.util.concurrent.ExecutionException ? e.getCause() : e;
                    fenced = cause.getClass().getSimpleName();
                }
                successor.beginTransaction();
                sendAll(successor, output, 0, values("successor", 2));
                successor.commitTransaction();
                emit("fenced", "old", fenced);
            }
        }
        try (KafkaConsumer<String, String> ends = consumer(Map.of("isolation.level", "read_committed"))) {
            emit("ends", "end", ends.endOffsets(List.of(out0)).get(out0));
        }
        emit("read_committed", "records", readAll(out0, "read_committed"));
        emit("read_uncommitted", "records", readAll(out0, "read_uncommitted"));
    }

    static Long offsetOf(OffsetAndMetadata committed) {
        return committed == null ? null : committed.offset();
    }

    // ---------------------------------------------------------------- group protocols

    static void groups() throws Exception {
        String topic = prefix + "-topic";
        createTopic(topic, 3);
        try (KafkaProducer<String, String> producer = producer(Map.of("acks", "all"))) {
            List<java.util.concurrent.Future<RecordMetadata>> sent = new ArrayList<>();
            for (int i = 0; i < 30; i++) sent.add(producer.send(new ProducerRecord<>(topic, i % 3, "k" + i, "v" + i)));
            for (var future : sent) future.get();
        }
        for (String protocol : List.of("classic", "consumer")) {
            String group = prefix + "-" + protocol;
            try (KafkaConsumer<String, String> consumer = consumer(Map.of("group.id", group,
                    "group.protocol", protocol))) {
                consumer.subscribe(List.of(topic));
                List<List<Object>> got = pollRecords(consumer, 30);
                consumer.commitSync();
                Map<TopicPartition, OffsetAndMetadata> committed = consumer.committed(new HashSet<>(
                        consumer.assignment()));
                Map<String, Long> offsets = new TreeMap<>();
                committed.forEach((tp, om) -> offsets.put(tp.toString(), offsetOf(om)));
                ConsumerGroupMetadata meta = consumer.groupMetadata();
                emit("consumed", "protocol", protocol, "records", got, "committed", offsets,
                        "assignment", names(consumer.assignment()), "generation", meta.generationId(),
                        "member", meta.memberId());
            }
        }
    }

    static List<String> names(Collection<TopicPartition> partitions) {
        List<String> out = new ArrayList<>();
        for (TopicPartition tp : partitions) out.add(tp.toString());
        Collections.sort(out);
        return out;
    }

    // ---------------------------------------------------------------- static membership, cooperative-sticky

    /** A consumer and what its rebalance listener was told, in order. */
    static class Member implements ConsumerRebalanceListener {
        final String name;
        final KafkaConsumer<String, String> consumer;
        final List<List<Object>> events = new ArrayList<>();

        Member(String name, String topic, Map<String, Object> config) {
            this.name = name;
            consumer = consumer(config);
            consumer.subscribe(List.of(topic), this);
        }

        public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
            events.add(List.of("revoked", names(partitions)));
        }

        public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
            events.add(List.of("assigned", names(partitions)));
        }

        public void onPartitionsLost(Collection<TopicPartition> partitions) {
            events.add(List.of("lost", names(partitions)));
        }

        Map<String, Object> state() {
            Map<String, Object> out = new LinkedHashMap<>();
            out.put("assignment", names(consumer.assignment()));
            out.put("generation", consumer.groupMetadata().generationId());
            out.put("events", new ArrayList<>(events));
            return out;
        }
    }

    /** Polls every member in turn until `done` holds (true) or WAIT_MS passed (false). */
    static boolean pollUntil(List<Member> members, java.util.function.BooleanSupplier done) {
        long deadline = System.currentTimeMillis() + WAIT_MS;
        while (System.currentTimeMillis() < deadline) {
            for (Member m : members) m.consumer.poll(Duration.ofMillis(50));
            if (done.getAsBoolean()) return true;
        }
        return false;
    }

    /** Polls every member in turn for `millis` (a rebalance that started shows in their listeners). */
    static void pollFor(List<Member> members, long millis) {
        long until = System.currentTimeMillis() + millis;
        while (System.currentTimeMillis() < until) {
            for (Member m : members) m.consumer.poll(Duration.ofMillis(50));
        }
    }

    static boolean settled(List<Member> members, int partitions) {
        int total = 0;
        Set<Integer> generations = new HashSet<>();
        for (Member m : members) {
            if (m.consumer.assignment().isEmpty()) return false;
            total += m.consumer.assignment().size();
            generations.add(m.consumer.groupMetadata().generationId());
        }
        return total == partitions && generations.size() == 1;
    }

    /** protocol: classic (the session timeout is the client's, 30 s) or consumer (KIP-848: the node's). */
    static void staticMembership(String protocol) throws Exception {
        String topic = prefix + "-topic", group = prefix + "-group";
        createTopic(topic, 2);
        Map<String, Object> base = protocol.equals("classic") ? Map.of("group.id", group, "group.protocol", protocol,
                "session.timeout.ms", 30000, "heartbeat.interval.ms", 1000)
                : Map.of("group.id", group, "group.protocol", protocol);
        Map<String, Object> configA = new HashMap<>(base), configB = new HashMap<>(base);
        configA.put("group.instance.id", prefix + "-a");
        configB.put("group.instance.id", prefix + "-b");
        Member a = new Member("a", topic, configA), b = new Member("b", topic, configB);
        boolean settled = pollUntil(List.of(a, b), () -> settled(List.of(a, b), 2));
        emit("joined", "settled", settled, "a", a.state(), "b", b.state());
        a.consumer.close();  // a static member leaves no LeaveGroup behind: its partitions wait for it
        Member again = new Member("a", topic, configA);
        boolean back = pollUntil(List.of(again, b), () -> !again.consumer.assignment().isEmpty());
        // Some more polls of both, so that a rebalance the return started would show in b's listener.
        pollFor(List.of(again, b), 3000);
        emit("returned", "back", back, "a", again.state(), "b", b.state());
        again.consumer.close();
        b.consumer.close();
    }

    static void cooperative() throws Exception {
        String topic = prefix + "-topic", group = prefix + "-group";
        createTopic(topic, 4);
        Map<String, Object> config = Map.of("group.id", group, "group.protocol", "classic",
                "partition.assignment.strategy", CooperativeStickyAssignor.class.getName());
        Member first = new Member("first", topic, config);
        boolean alone = pollUntil(List.of(first), () -> first.consumer.assignment().size() == 4);
        emit("alone", "settled", alone, "first", first.state());
        Member second = new Member("second", topic, config);
        boolean shared = pollUntil(List.of(first, second), () -> first.consumer.assignment().size() == 2
                && second.consumer.assignment().size() == 2);
        // Rebalances settle: a few more polls of both.
        pollFor(List.of(first, second), 2000);
        emit("shared", "settled", shared, "first", first.state(), "second", second.state());
        second.consumer.close();
        boolean back = pollUntil(List.of(first), () -> first.consumer.assignment().size() == 4);
        emit("second-left", "settled", back, "first", first.state());
        first.consumer.close();
    }
}
