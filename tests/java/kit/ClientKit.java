// What the Java test programs of tests/java/ share: their JSON step lines and their String producers and
// consumers. It is compiled with each program, once (tests/test_java_clients.java_command, kafka_peer.program), and
// the program reaches this class by its simple name (both are in the unnamed package).
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.UncheckedIOException;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.Map;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public final class ClientKit {
    private static final ObjectMapper JSON = new ObjectMapper();

    private ClientKit() {
    }

    /** key1, value1, key2, value2, ... as a map in that order. */
    public static Map<String, Object> pairs(Object... pairs) {
        Map<String, Object> out = new LinkedHashMap<>();
        for (int i = 0; i < pairs.length; i += 2) out.put((String) pairs[i], pairs[i + 1]);
        return out;
    }

    /** One JSON line on stdout, flushed at once (the tests read the lines as they come); one line at a time. */
    public static synchronized void print(Map<String, Object> line) {
        try {
            System.out.println(JSON.writeValueAsString(line));
        } catch (com.fasterxml.jackson.core.JsonProcessingException e) {
            throw new UncheckedIOException(e);
        }
        System.out.flush();
    }

    /** The line {"step": step, key1: value1, ...}. */
    public static void emit(String step, Object... pairs) {
        Map<String, Object> line = new LinkedHashMap<>();
        line.put("step", step);
        line.putAll(pairs(pairs));
        print(line);
    }

    /** A producer of String keys and values to `bootstrap`, sending at once (linger.ms 0), with `more` config. */
    public static KafkaProducer<String, String> producer(String bootstrap, Map<String, Object> more) {
        Map<String, Object> config = new HashMap<>(Map.of("bootstrap.servers", bootstrap,
                "key.serializer", StringSerializer.class.getName(),
                "value.serializer", StringSerializer.class.getName(), "linger.ms", 0));
        config.putAll(more);
        return new KafkaProducer<>(config);
    }

    /** A consumer of String keys and values from `bootstrap`, from the earliest offset, committing only when asked,
     * with `more` config. */
    public static KafkaConsumer<String, String> consumer(String bootstrap, Map<String, Object> more) {
        Map<String, Object> config = new HashMap<>(Map.of("bootstrap.servers", bootstrap,
                "key.deserializer", StringDeserializer.class.getName(),
                "value.deserializer", StringDeserializer.class.getName(),
                "auto.offset.reset", "earliest", "enable.auto.commit", false));
        config.putAll(more);
        return new KafkaConsumer<>(config);
    }
}
