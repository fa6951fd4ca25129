// A KIP-932 share consumer with kafka-clients 4.3 (KafkaShareConsumer), explicit
// acknowledgement: reads until it has WANT records or WAIT_S seconds passed, acknowledging each
// record (ACCEPT, or RELEASE for the first delivery of every record whose value ends in "7",
// which must come back with delivery count 2) and committing after each poll.
// Prints: read <distinct values>, duplicates <values read twice>, redelivered <n>, values <v,...>.
// Args: bootstrap group topic want wait_s
import java.time.Duration;
import java.util.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.common.serialization.StringDeserializer;

public class ShareConsumerExplicit {
    public static void main(String[] a) {
        Properties p = new Properties();
        p.put("bootstrap.servers", a[0]);
        p.put("group.id", a[1]);
        p.put("share.acknowledgement.mode", "explicit");
        p.put("key.deserializer", StringDeserializer.class.getName());
        p.put("value.deserializer", StringDeserializer.class.getName());
        int want = Integer.parseInt(a[3]);
        long deadline = System.currentTimeMillis() + 1000L * Integer.parseInt(a[4]);
        Set<String> seen = new HashSet<>();
        int duplicates = 0, redelivered = 0;
        try (KafkaShareConsumer<String, String> c = new KafkaShareConsumer<>(p)) {
            c.subscribe(List.of(a[2]));
            while (seen.size() < want && System.currentTimeMillis() < deadline) {
                ConsumerRecords<String, String> rs = c.poll(Duration.ofMillis(500));
                for (ConsumerRecord<String, String> r : rs) {
                    int count = r.deliveryCount().orElse((short) 1);
                    if (r.value().endsWith("7") && count == 1) {
                        c.acknowledge(r, AcknowledgeType.RELEASE);
                        continue;
                    }
                    if (count > 1) redelivered++;
                    if (!seen.add(r.value())) duplicates++;
                    c.acknowledge(r, AcknowledgeType.ACCEPT);
                }
                if (!rs.isEmpty()) c.commitSync();
            }
        }
        System.out.println("read " + seen.size());
        System.out.println("duplicates " + duplicates);
        System.out.println("redelivered " + redelivered);
        System.out.println("values " + String.join(",", new TreeSet<>(seen)));
    }
}
