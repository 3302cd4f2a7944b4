// Apache Kafka's Java AdminClient against a node, every step in one run:
//   java -cp <Kafka's jars>:<ClientKit> tests/java/AdminSteps.java <bootstrap> <prefix>
// Each step prints one JSON line {"step": ..., ...}, or {"step": ..., "error": "<exception>: <message>"} when the
// client threw; the run goes on with the next step. tests/test_java_clients.py asserts on them. The names of
// topics, groups, users and transactional ids start with <prefix>; every wait is bounded.
import java.time.Duration;
import java.util.*;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.*;
import org.apache.kafka.common.acl.*;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.resource.*;

public class AdminSteps {
    static final long WAIT_MS = 30_000;
    static String bootstrap;
    static String prefix;
    static Admin admin;

    interface Step {
        Map<String, Object> run() throws Exception;
    }

    public static void main(String[] args) throws Exception {
        bootstrap = args[0];
        prefix = args[1];
        admin = Admin.create(Map.of("bootstrap.servers", bootstrap, "default.api.timeout.ms", 30000,
                "request.timeout.ms", 15000));
        try {
            step("topics", AdminSteps::topics);
            step("configs", AdminSteps::configs);
            step("offsets", AdminSteps::offsets);
            step("groups", AdminSteps::groups);
            step("acls", AdminSteps::acls);
            step("scram", AdminSteps::scram);
            step("transactions", AdminSteps::transactions);
            step("abort-transaction", AdminSteps::abortTransaction);
            step("cluster", AdminSteps::cluster);
            step("features", AdminSteps::features);
        } finally {
            admin.close(Duration.ofSeconds(10));
        }
    }

    static void step(String name, Step body) throws Exception {
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("step", name);
        try {
            line.putAll(body.run());
        } catch (Exception e) {
            Throwable cause = e instanceof ExecutionException && e.getCause() != null ? e.getCause() : e;
            line.put("error", cause.getClass().getSimpleName() + ": " + cause.getMessage());
        }
        ClientKit.print(line);
    }

    static Map<String, Object> map(Object... pairs) {
        return ClientKit.pairs(pairs);
    }

    static <T> T get(KafkaFuture<T> future) throws Exception {
        return future.get(WAIT_MS, TimeUnit.MILLISECONDS);
    }

    /** "described" when a describe of something that is not there succeeds, else the name of its error. */
    static String describedOrError(KafkaFuture<?> future) throws Exception {
        try {
            get(future);
            return "described";
        } catch (ExecutionException e) {
            return e.getCause().getClass().getSimpleName();
        }
    }

    static List<String> sorted(Collection<String> names) {
        List<String> out = new ArrayList<>(names);
        Collections.sort(out);
        return out;
    }

    static List<String> ours(Collection<String> names) {
        List<String> out = new ArrayList<>();
        for (String name : names) if (name.startsWith(prefix)) out.add(name);
        Collections.sort(out);
        return out;
    }

    static KafkaProducer<String, String> producer(Map<String, Object> more) {
        return ClientKit.producer(bootstrap, more);
    }

    static KafkaConsumer<String, String> consumer(Map<String, Object> more) {
        return ClientKit.consumer(bootstrap, more);
    }

    /** Partition -> [leader id, replicas, isr] of a described topic. */
    static Map<String, Object> partitions(String topic) throws Exception {
        TopicDescription described = get(admin.describeTopics(List.of(topic)).allTopicNames()).get(topic);
        Map<String, Object> out = new TreeMap<>();
        for (TopicPartitionInfo p : described.partitions()) {
            out.put(String.valueOf(p.partition()), List.of(p.leader().id(), p.replicas().size(), p.isr().size()));
        }
        return out;
    }

    // ---------------------------------------------------------------- topics, partitions, configs

    static Map<String, Object> topics() throws Exception {
        String a = prefix + "-a", b = prefix + "-b";
        get(admin.createTopics(List.of(new NewTopic(a, 2, (short) 1).configs(Map.of("retention.ms", "3600000")),
                new NewTopic(b, Optional.empty(), Optional.empty()))).all());
        List<String> listed = ours(get(admin.listTopics().names()));
        Map<String, Object> before = partitions(a);
        Map<String, Object> defaults = partitions(b);
        String again;
        try {
            get(admin.createTopics(List.of(new NewTopic(a, 1, (short) 1))).all());
            again = "created";
        } catch (ExecutionException e) {
            again = e.getCause().getClass().getSimpleName();
        }
        get(admin.createPartitions(Map.of(a, NewPartitions.increaseTo(4))).all());
        Map<String, Object> after = partitions(a);
        get(admin.deleteTopics(List.of(b)).all());
        List<String> left = ours(get(admin.listTopics().names()));
        return map("listed", listed, "partitions", before, "default_partitions", defaults, "create_again", again,
                "grown", after, "after_delete", left);
    }

    static Map<String, Object> configs() throws Exception {
        ConfigResource topic = new ConfigResource(ConfigResource.Type.TOPIC, prefix + "-a");
        get(admin.incrementalAlterConfigs(Map.of(topic, List.of(
                new AlterConfigOp(new ConfigEntry("retention.ms", "1000"), AlterConfigOp.OpType.SET),
                new AlterConfigOp(new ConfigEntry("cleanup.policy", "compact"), AlterConfigOp.OpType.APPEND),
                new AlterConfigOp(new ConfigEntry("max.message.bytes", "65536"), AlterConfigOp.OpType.SET)))).all());
        Map<String, Object> set = describeConfigs(topic, "retention.ms", "cleanup.policy", "max.message.bytes");
        get(admin.incrementalAlterConfigs(Map.of(topic, List.of(
                new AlterConfigOp(new ConfigEntry("retention.ms", ""), AlterConfigOp.OpType.DELETE),
                new AlterConfigOp(new ConfigEntry("cleanup.policy", "delete"), AlterConfigOp.OpType.SUBTRACT)))).all());
        Map<String, Object> deleted = describeConfigs(topic, "retention.ms", "cleanup.policy", "max.message.bytes");
        String refused;
        try {
            get(admin.incrementalAlterConfigs(Map.of(topic, List.of(new AlterConfigOp(
                    new ConfigEntry("no.such.config", "1"), AlterConfigOp.OpType.SET)))).all());
            refused = "accepted";
        } catch (ExecutionException e) {
            refused = e.getCause().getClass().getSimpleName();
        }
        ConfigResource broker = new ConfigResource(ConfigResource.Type.BROKER, "");
        get(admin.incrementalAlterConfigs(Map.of(broker, List.of(new AlterConfigOp(
                new ConfigEntry("log.retention.ms", "7200000"), AlterConfigOp.OpType.SET)))).all());
        Map<String, Object> brokerSet = describeConfigs(broker, "log.retention.ms");
        get(admin.incrementalAlterConfigs(Map.of(broker, List.of(new AlterConfigOp(
                new ConfigEntry("log.retention.ms", ""), AlterConfigOp.OpType.DELETE)))).all());
        return map("set", set, "deleted", deleted, "unknown_key", refused, "broker_default", brokerSet);
    }

    /** name -> [value, source] */
    static Map<String, Object> describeConfigs(ConfigResource resource, String... names) throws Exception {
        Config config = get(admin.describeConfigs(List.of(resource)).all()).get(resource);
        Map<String, Object> out = new TreeMap<>();
        for (String name : names) {
            ConfigEntry entry = config.get(name);
            out.put(name, entry == null ? null : Arrays.asList(entry.value(), entry.source().name()));
        }
        return out;
    }

    // ---------------------------------------------------------------- records and offsets

    static Map<String, Object> offsets() throws Exception {
        String topic = prefix + "-offsets";
        get(admin.createTopics(List.of(new NewTopic(topic, 1, (short) 1))).all());
        TopicPartition tp = new TopicPartition(topic, 0);
        long base = System.currentTimeMillis() - 60_000;
        try (KafkaProducer<String, String> producer = producer(Map.of("acks", "all"))) {
            for (int i = 0; i < 10; i++) {
                producer.send(new ProducerRecord<>(topic, 0, base + i * 1000, "k" + i, "v" + i));
            }
            producer.flush();
        }
        Map<String, Object> before = listOffsets(tp, base);
        long low = get(admin.deleteRecords(Map.of(tp, RecordsToDelete.beforeOffset(4))).lowWatermarks().get(tp))
                .lowWatermark();
        Map<String, Object> after = listOffsets(tp, base);
        String past;
        try {
            get(admin.deleteRecords(Map.of(tp, RecordsToDelete.beforeOffset(11))).all());
            past = "deleted";
        } catch (ExecutionException e) {
            past = e.getCause().getClass().getSimpleName();
        }
        return map("before", before, "low_watermark", low, "after", after, "past_the_end", past);
    }

    static Map<String, Object> listOffsets(TopicPartition tp, long base) throws Exception {
        Map<String, OffsetSpec> specs = new LinkedHashMap<>();
        specs.put("earliest", OffsetSpec.earliest());
        specs.put("latest", OffsetSpec.latest());
        specs.put("max_timestamp", OffsetSpec.maxTimestamp());
        specs.put("at_5", OffsetSpec.forTimestamp(base + 5000));
        specs.put("at_2_5", OffsetSpec.forTimestamp(base + 2500));
        specs.put("after_all", OffsetSpec.forTimestamp(base + 60_000));
        Map<String, Object> out = new LinkedHashMap<>();
        for (var spec : specs.entrySet()) {
            ListOffsetsResult.ListOffsetsResultInfo info = get(admin.listOffsets(Map.of(tp, spec.getValue()))
                    .partitionResult(tp));
            out.put(spec.getKey(), List.of(info.offset(), info.timestamp() == -1 ? -1 : info.timestamp() - base));
        }
        return out;
    }

    // ---------------------------------------------------------------- consumer groups

    static Map<String, Object> groups() throws Exception {
        String topic = prefix + "-a", classic = prefix + "-classic", modern = prefix + "-848";
        try (KafkaProducer<String, String> producer = producer(Map.of("acks", "all"))) {
            for (int i = 0; i < 8; i++) producer.send(new ProducerRecord<>(topic, i % 4, "k" + i, "v" + i));
            producer.flush();
        }
        Map<String, Object> out = new LinkedHashMap<>();
        try (KafkaConsumer<String, String> one = consumer(Map.of("group.id", classic, "group.protocol", "classic"));
             KafkaConsumer<String, String> two = consumer(Map.of("group.id", modern, "group.protocol", "consumer"))) {
            one.subscribe(List.of(topic));
            two.subscribe(List.of(topic));
            int seen = 0;
            long deadline = System.currentTimeMillis() + WAIT_MS;
            Set<String> fromTwo = new HashSet<>();
            while ((seen < 8 || fromTwo.size() < 8) && System.currentTimeMillis() < deadline) {
                seen += one.poll(Duration.ofMillis(100)).count();
                for (var r : two.poll(Duration.ofMillis(100))) fromTwo.add(r.value());
            }
            one.commitSync();
            two.commitSync();
            out.put("consumed", List.of(seen, fromTwo.size()));
            out.put("listed_active", listGroups());
            Map<String, ConsumerGroupDescription> described = get(admin.describeConsumerGroups(
                    List.of(classic, modern)).all());
            Map<String, Object> descriptions = new TreeMap<>();
            for (var entry : described.entrySet()) {
                ConsumerGroupDescription d = entry.getValue();
                List<Object> members = new ArrayList<>();
                for (MemberDescription m : d.members()) {
                    List<String> assigned = new ArrayList<>();
                    for (TopicPartition tp : m.assignment().topicPartitions()) assigned.add(tp.toString());
                    Collections.sort(assigned);
                    members.add(map("client_id", m.clientId(), "assignment", assigned));
                }
                descriptions.put(entry.getKey(), map("type", String.valueOf(d.type()), "state",
                        String.valueOf(d.groupState()), "assignor", d.partitionAssignor(), "members", members,
                        "simple", d.isSimpleConsumerGroup()));
            }
            out.put("described", descriptions);
            out.put("describe_unknown",
                    describedOrError(admin.describeConsumerGroups(List.of(prefix + "-nobody")).all()));
            String busy;
            try {
                get(admin.alterConsumerGroupOffsets(classic, Map.of(new TopicPartition(topic, 0),
                        new OffsetAndMetadata(0))).all());
                busy = "altered";
            } catch (ExecutionException e) {
                busy = e.getCause().getClass().getSimpleName();
            }
            out.put("alter_while_active", busy);
        }
        out.put("listed_after_close", listGroups());
        get(admin.alterConsumerGroupOffsets(classic, Map.of(new TopicPartition(topic, 0), new OffsetAndMetadata(1),
                new TopicPartition(topic, 1), new OffsetAndMetadata(0, "from java"))).all());
        Map<String, Object> offsets = new TreeMap<>();
        for (var entry : get(admin.listConsumerGroupOffsets(classic).partitionsToOffsetAndMetadata()).entrySet()) {
            offsets.put(entry.getKey().toString(), List.of(entry.getValue().offset(), entry.getValue().metadata()));
        }
        out.put("offsets_altered", offsets);
        get(admin.deleteConsumerGroups(List.of(classic, modern)).all());
        out.put("listed_after_delete", listGroups());
        return out;
    }

    /** Our groups: id -> [type, state, protocol]. */
    static Map<String, Object> listGroups() throws Exception {
        Map<String, Object> out = new TreeMap<>();
        for (GroupListing g : get(admin.listGroups(ListGroupsOptions.forConsumerGroups()).all())) {
            if (g.groupId().startsWith(prefix)) {
                out.put(g.groupId(), List.of(g.type().map(String::valueOf).orElse("?"),
                        g.groupState().map(String::valueOf).orElse("?"), g.protocol()));
            }
        }
        return out;
    }

    // ---------------------------------------------------------------- ACLs and SCRAM users

    static Map<String, Object> acls() throws Exception {
        String topic = prefix + "-a";
        AclBinding readTopic = new AclBinding(new ResourcePattern(ResourceType.TOPIC, topic, PatternType.LITERAL),
                new AccessControlEntry("User:alice", "*", AclOperation.READ, AclPermissionType.ALLOW));
        AclBinding denyGroups = new AclBinding(new ResourcePattern(ResourceType.GROUP, prefix, PatternType.PREFIXED),
                new AccessControlEntry("User:bob", "127.0.0.1", AclOperation.ALL, AclPermissionType.DENY));
        AclBinding cluster = new AclBinding(new ResourcePattern(ResourceType.CLUSTER, "kafka-cluster",
                PatternType.LITERAL), new AccessControlEntry("User:alice", "*", AclOperation.DESCRIBE,
                AclPermissionType.ALLOW));
        get(admin.createAcls(List.of(readTopic, denyGroups, cluster)).all());
        List<String> all = describeAcls(AclBindingFilter.ANY);
        List<String> alices = describeAcls(new AclBindingFilter(ResourcePatternFilter.ANY, new AccessControlEntryFilter(
                "User:alice", null, AclOperation.ANY, AclPermissionType.ANY)));
        List<String> matching = describeAcls(new AclBindingFilter(new ResourcePatternFilter(ResourceType.GROUP,
                prefix + "-consumers", PatternType.MATCH), AccessControlEntryFilter.ANY));
        List<String> deleted = new ArrayList<>();
        for (var result : get(admin.deleteAcls(List.of(new AclBindingFilter(ResourcePatternFilter.ANY,
                new AccessControlEntryFilter("User:alice", null, AclOperation.ANY, AclPermissionType.ANY)))).all())) {
            deleted.add(result.toString());
        }
        Collections.sort(deleted);
        String invalid;
        try {
            get(admin.createAcls(List.of(new AclBinding(new ResourcePattern(ResourceType.TOPIC, topic,
                    PatternType.LITERAL), new AccessControlEntry("alice", "*", AclOperation.READ,
                    AclPermissionType.ALLOW)))).all());
            invalid = "created";
        } catch (ExecutionException e) {
            invalid = e.getCause().getClass().getSimpleName();
        }
        return map("all", all, "alices", alices, "matching_group", matching, "deleted", deleted,
                "left", describeAcls(AclBindingFilter.ANY), "bad_principal", invalid);
    }

    static List<String> describeAcls(AclBindingFilter filter) throws Exception {
        List<String> out = new ArrayList<>();
        for (AclBinding binding : get(admin.describeAcls(filter).values())) out.add(binding.toString());
        Collections.sort(out);
        return out;
    }

    static Map<String, Object> scram() throws Exception {
        String alice = prefix + "-alice", bob = prefix + "-bob";
        // Kafka's controller takes one change per user in a request: alice's second mechanism takes another.
        Map<String, Object> first = new TreeMap<>();
        for (var entry : admin.alterUserScramCredentials(List.of(
                new UserScramCredentialUpsertion(alice, new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192),
                        "alice-secret"),
                new UserScramCredentialUpsertion(alice, new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096),
                        "alice-secret"),
                new UserScramCredentialUpsertion(bob, new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 10000),
                        "bob-secret"))).values().entrySet()) {
            try {
                get(entry.getValue());
                first.put(entry.getKey(), "altered");
            } catch (ExecutionException e) {
                first.put(entry.getKey(), e.getCause().getClass().getSimpleName());
            }
        }
        Map<String, Object> afterFirst = describeScram(null);
        get(admin.alterUserScramCredentials(List.of(new UserScramCredentialUpsertion(alice,
                new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192), "alice-secret"))).all());
        get(admin.alterUserScramCredentials(List.of(new UserScramCredentialUpsertion(alice,
                new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), "alice-secret"))).all());
        Map<String, Object> both = describeScram(null);
        get(admin.alterUserScramCredentials(List.of(new UserScramCredentialDeletion(alice,
                ScramMechanism.SCRAM_SHA_256))).all());
        Map<String, Object> one = describeScram(List.of(alice));
        // all() leaves out a user without credentials (RESOURCE_NOT_FOUND); description(user) raises it.
        Map<String, Object> unknownInAll = describeScram(List.of(prefix + "-nobody"));
        String unknown = describedOrError(
                admin.describeUserScramCredentials(List.of(prefix + "-nobody")).description(prefix + "-nobody"));
        String tooFew;
        try {
            get(admin.alterUserScramCredentials(List.of(new UserScramCredentialUpsertion(bob,
                    new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 10), "x"))).all());
            tooFew = "accepted";
        } catch (ExecutionException e) {
            tooFew = e.getCause().getClass().getSimpleName();
        }
        return map("one_request", first, "after_one_request", afterFirst, "described", both, "after_delete", one,
                "unknown_in_all", unknownInAll, "unknown_user", unknown, "ten_iterations", tooFew);
    }

    /** user -> [mechanism/iterations, ...] of our users (users null: every user). */
    static Map<String, Object> describeScram(List<String> users) throws Exception {
        DescribeUserScramCredentialsResult result = users == null ? admin.describeUserScramCredentials()
                : admin.describeUserScramCredentials(users);
        Map<String, Object> out = new TreeMap<>();
        for (var entry : get(result.all()).entrySet()) {
            if (!entry.getKey().startsWith(prefix)) continue;
            List<String> infos = new ArrayList<>();
            for (ScramCredentialInfo info : entry.getValue().credentialInfos()) {
                infos.add(info.mechanism() + "/" + info.iterations());
            }
            Collections.sort(infos);
            out.put(entry.getKey(), infos);
        }
        return out;
    }

    // ---------------------------------------------------------------- transactions

    static KafkaProducer<String, String> openTransaction;

    static Map<String, Object> transactions() throws Exception {
        String topic = prefix + "-tx", id = prefix + "-open";
        get(admin.createTopics(List.of(new NewTopic(topic, 1, (short) 1))).all());
        openTransaction = producer(Map.of("transactional.id", id));
        openTransaction.initTransactions();
        openTransaction.beginTransaction();
        openTransaction.send(new ProducerRecord<>(topic, 0, "k", "open")).get();
        TransactionDescription d = get(admin.describeTransactions(List.of(id)).all()).get(id);
        List<String> parts = new ArrayList<>();
        for (TopicPartition tp : d.topicPartitions()) parts.add(tp.toString());
        Map<String, Object> listed = new TreeMap<>();
        for (TransactionListing t : get(admin.listTransactions().all())) {
            if (t.transactionalId().startsWith(prefix)) {
                listed.put(t.transactionalId(), List.of(t.state().toString(), t.producerId() == d.producerId()));
            }
        }
        Map<String, Object> ongoing = new TreeMap<>();
        for (TransactionListing t : get(admin.listTransactions(new ListTransactionsOptions().filterStates(
                List.of(TransactionState.ONGOING))).all())) {
            if (t.transactionalId().startsWith(prefix)) ongoing.put(t.transactionalId(), t.state().toString());
        }
        String unknown = describedOrError(admin.describeTransactions(List.of(prefix + "-nobody")).all());
        TopicPartition tp = new TopicPartition(topic, 0);
        long lso = get(admin.listOffsets(Map.of(tp, OffsetSpec.latest()), new ListOffsetsOptions(
                IsolationLevel.READ_COMMITTED)).partitionResult(tp)).offset();
        long hw = get(admin.listOffsets(Map.of(tp, OffsetSpec.latest())).partitionResult(tp)).offset();
        return map("state", d.state().toString(), "partitions", parts, "epoch", d.producerEpoch(),
                "timeout_ms", d.transactionTimeoutMs(), "started", d.transactionStartTimeMs().isPresent(),
                "listed", listed, "ongoing", ongoing, "unknown_id", unknown, "lso", lso, "high_watermark", hw);
    }

    /** Abort the open transaction's partition from the admin side (kafka-transactions abort: WriteTxnMarkers). */
    static Map<String, Object> abortTransaction() throws Exception {
        String topic = prefix + "-tx", id = prefix + "-open";
        TopicPartition tp = new TopicPartition(topic, 0);
        try {
            TransactionDescription d = get(admin.describeTransactions(List.of(id)).all()).get(id);
            Map<String, Object> out = new LinkedHashMap<>();
            try {
                get(admin.abortTransaction(new AbortTransactionSpec(tp, d.producerId(), (short) d.producerEpoch(),
                        d.coordinatorId())).all());
                out.put("aborted", true);
            } catch (ExecutionException e) {
                out.put("aborted", e.getCause().getClass().getSimpleName() + ": " + e.getCause().getMessage());
            }
            long lso = get(admin.listOffsets(Map.of(tp, OffsetSpec.latest()), new ListOffsetsOptions(
                    IsolationLevel.READ_COMMITTED)).partitionResult(tp)).offset();
            out.put("lso", lso);
            return out;
        } finally {
            try {
                openTransaction.abortTransaction();
            } catch (Exception ignored) {
                // already aborted from the admin side, or fenced
            }
            openTransaction.close(Duration.ofSeconds(10));
        }
    }

    // ---------------------------------------------------------------- cluster and features

    static Map<String, Object> cluster() throws Exception {
        DescribeClusterResult c = admin.describeCluster();
        List<Object> nodes = new ArrayList<>();
        for (Node n : get(c.nodes())) nodes.add(List.of(n.id(), n.host(), n.port()));
        Node controller = get(c.controller());
        return map("cluster_id", get(c.clusterId()), "nodes", nodes, "controller",
                controller == null ? null : controller.id());
    }

    static Map<String, Object> features() throws Exception {
        FeatureMetadata f = get(admin.describeFeatures().featureMetadata());
        Map<String, Object> finalized = new TreeMap<>(), supported = new TreeMap<>();
        f.finalizedFeatures().forEach((k, v) -> finalized.put(k, List.of(v.minVersionLevel(), v.maxVersionLevel())));
        f.supportedFeatures().forEach((k, v) -> supported.put(k, List.of(v.minVersion(), v.maxVersion())));
        return map("finalized", finalized, "supported", supported, "epoch", f.finalizedFeaturesEpoch().orElse(null));
    }
}
