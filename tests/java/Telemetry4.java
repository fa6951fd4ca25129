// KIP-714 with kafka-clients 4.3: a producer and a consumer (enable.metrics.push on by default)
// ask for their client instance ids (GetTelemetrySubscriptions), produce and read, and close
// (a terminating PushTelemetry with their last metrics). Prints "producer <id>", "consumer <id>".
import java.time.Duration;
import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class Telemetry4 {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1];
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("client.id", "java-tele-producer");
        p.put("key.serializer", StringSerializer.class.getName());
        p.put("value.serializer", StringSerializer.class.getName());
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
            for (int i = 0; i < 20; i++) producer.send(new ProducerRecord<>(topic, "v" + i)).get();
            System.out.println("producer " + producer.clientInstanceId(Duration.ofSeconds(30)));
            // A producer closed right after its subscription may not push at all (4.3 sends
            // the terminating push only from a pushing state): keep it busy for three intervals.
            long until = System.currentTimeMillis() + 3000;
            while (System.currentTimeMillis() < until) {
                producer.send(new ProducerRecord<>(topic, "more")).get();
                Thread.sleep(50);
            }
        }
        Properties c = new Properties();
        c.put("bootstrap.servers", bootstrap);
        c.put("client.id", "java-tele-consumer");
        c.put("group.id", "java-tele");
        c.put("group.protocol", "consumer");
        c.put("auto.offset.reset", "earliest");
        c.put("key.deserializer", StringDeserializer.class.getName());
        c.put("value.deserializer", StringDeserializer.class.getName());
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(c)) {
            consumer.subscribe(List.of(topic));
            int read = 0;
            long deadline = System.currentTimeMillis() + 60000;
            while (read < 20 && System.currentTimeMillis() < deadline)
                read += consumer.poll(Duration.ofMillis(200)).count();
            System.out.println("read " + read);
            System.out.println("consumer " + consumer.clientInstanceId(Duration.ofSeconds(30)));
        }
    }
}
