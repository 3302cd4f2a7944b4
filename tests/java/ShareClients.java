// Apache Kafka's Java share consumer (KIP-932: KafkaShareConsumer) and its admin calls against a node, in one run:
//   java -cp <Kafka's jars> tests/java/ShareClients.java <bootstrap> <prefix>
// Each step prints one JSON line {"step": ..., ...}; tests/test_share_groups.py asserts on them. Every wait is
// bounded (WAIT_MS); the names of the topic and the group start with <prefix>.
import com.fasterxml.jackson.databind.ObjectMapper;
import java.time.Duration;
import java.util.*;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class ShareClients {
    static final long WAIT_MS = 30_000;
    static final ObjectMapper JSON = new ObjectMapper();

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1] + "-q", group = args[1] + "-g";
        try (Admin admin = Admin.create(Map.of("bootstrap.servers", bootstrap))) {
            admin.createTopics(List.of(new NewTopic(topic, 1, (short) 1))).all().get();
            ConfigResource resource = new ConfigResource(ConfigResource.Type.GROUP, group);
            admin.incrementalAlterConfigs(Map.of(resource, List.of(new AlterConfigOp(
                    new ConfigEntry("share.auto.offset.reset", "earliest"), AlterConfigOp.OpType.SET)))).all().get();
            try (KafkaProducer<String, String> producer = new KafkaProducer<>(Map.of("bootstrap.servers", bootstrap,
                    "key.serializer", StringSerializer.class.getName(),
                    "value.serializer", StringSerializer.class.getName(), "linger.ms", 0))) {
                for (int i = 0; i < 10; i++) producer.send(new ProducerRecord<>(topic, 0, null, "v" + i)).get();
            }
            try (KafkaShareConsumer<String, String> consumer = new KafkaShareConsumer<>(Map.of(
                    "bootstrap.servers", bootstrap, "group.id", group, "client.id", "java-share",
                    "share.acknowledgement.mode", "explicit",
                    "key.deserializer", StringDeserializer.class.getName(),
                    "value.deserializer", StringDeserializer.class.getName()))) {
                consumer.subscribe(List.of(topic));
                List<ConsumerRecord<String, String>> first = take(consumer, 10, r -> r.offset() < 5
                        ? AcknowledgeType.ACCEPT : r.offset() < 8 ? AcknowledgeType.RELEASE : AcknowledgeType.REJECT);
                Map<?, Optional<org.apache.kafka.common.KafkaException>> committed = consumer.commitSync();
                emit("first", "records", rows(first), "commit_errors",
                     committed.values().stream().filter(Optional::isPresent).count(),
                     "lock_ms", consumer.acquisitionLockTimeoutMs().orElse(-1));
                List<ConsumerRecord<String, String>> again = take(consumer, 3, r -> AcknowledgeType.ACCEPT);
                consumer.commitSync();
                emit("redelivered", "records", rows(again));

                ShareGroupDescription described = admin.describeShareGroups(List.of(group)).all().get().get(group);
                List<Object> members = new ArrayList<>();
                for (ShareMemberDescription m : described.members()) {
                    List<String> assigned = new ArrayList<>();
                    for (TopicPartition tp : m.assignment().topicPartitions()) assigned.add(tp.toString());
                    members.add(List.of(m.clientId(), assigned));
                }
                emit("described", "state", described.groupState().toString(), "members", members);
                Map<TopicPartition, SharePartitionOffsetInfo> offsets = admin.listShareGroupOffsets(
                        Map.of(group, new ListShareGroupOffsetsSpec())).partitionsToOffsetInfo(group).get();
                SharePartitionOffsetInfo info = offsets.get(new TopicPartition(topic, 0));
                emit("offsets", "start", info == null ? null : info.startOffset(),
                     "lag", info == null ? null : info.lag().orElse(-1L));
            }
        }
    }

    // Poll until `count` records came, each acknowledged as `how` says before the next poll (explicit mode).
    static List<ConsumerRecord<String, String>> take(KafkaShareConsumer<String, String> consumer, int count,
                                                     java.util.function.Function<ConsumerRecord<String, String>,
                                                             AcknowledgeType> how) {
        List<ConsumerRecord<String, String>> got = new ArrayList<>();
        long deadline = System.currentTimeMillis() + WAIT_MS;
        while (got.size() < count && System.currentTimeMillis() < deadline) {
            for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(500))) {
                got.add(r);
                consumer.acknowledge(r, how.apply(r));
            }
        }
        return got;
    }

    static List<Object> rows(List<ConsumerRecord<String, String>> records) {
        List<Object> rows = new ArrayList<>();
        for (ConsumerRecord<String, String> r : records) {
            rows.add(List.of(r.offset(), r.value(), (int) r.deliveryCount().orElse((short) -1)));
        }
        return rows;
    }

    static void emit(String step, Object... pairs) throws Exception {
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("step", step);
        for (int i = 0; i < pairs.length; i += 2) line.put((String) pairs[i], pairs[i + 1]);
        System.out.println(JSON.writeValueAsString(line));
        System.out.flush();
    }
}
