// A KIP-932 share consumer with kafka-clients 4.3 (KafkaShareConsumer), explicit
// acknowledgement, renewing its locks (KIP-1222, AcknowledgeType.RENEW): polls until it holds
// WANT records, then for HOLD_S seconds renews every one of them each RENEW_MS and commits,
// then ACCEPTs them all. Prints: held <values>, renewals <n>, renew_errors <n>, again <values
// the broker delivered again (delivery count 2, or new), accepted <n>.
// Args: bootstrap group topic want hold_s renew_ms
import java.time.Duration;
import java.util.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicIdPartition;
import org.apache.kafka.common.serialization.StringDeserializer;

public class ShareConsumerRenew {
    public static void main(String[] a) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", a[0]);
        p.put("group.id", a[1]);
        p.put("share.acknowledgement.mode", "explicit");
        p.put("key.deserializer", StringDeserializer.class.getName());
        p.put("value.deserializer", StringDeserializer.class.getName());
        int want = Integer.parseInt(a[3]);
        long holdMs = 1000L * Integer.parseInt(a[4]);
        long renewMs = Long.parseLong(a[5]);
        List<ConsumerRecord<String, String>> held = new ArrayList<>();
        Set<String> values = new TreeSet<>();
        Set<String> again = new TreeSet<>();
        int renewals = 0, renewErrors = 0, accepted = 0;
        try (KafkaShareConsumer<String, String> c = new KafkaShareConsumer<>(p)) {
            c.subscribe(List.of(a[2]));
            long deadline = System.currentTimeMillis() + 60_000;
            while (held.size() < want && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(500))) {
                    if (!values.add(r.value())) again.add(r.value());
                    held.add(r);
                }
            }
            long end = System.currentTimeMillis() + holdMs;
            while (System.currentTimeMillis() < end) {
                for (ConsumerRecord<String, String> r : held) c.acknowledge(r, AcknowledgeType.RENEW);
                Map<TopicIdPartition, Optional<KafkaException>> res = c.commitSync();
                renewals++;
                for (Optional<KafkaException> e : res.values()) if (e.isPresent()) {
                    renewErrors++;
                    System.out.println("renew_error " + e.get());
                }
                // Polls go on (a renewing consumer keeps polling): the client hands the renewed
                // records back (delivery count unchanged); a lapsed lock would have the broker
                // deliver them again, delivery count 2.
                Thread.sleep(renewMs);
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(100))) {
                    if (r.deliveryCount().orElse((short) 1) > 1 || !values.contains(r.value()))
                        again.add(r.value());
                }
            }
            for (ConsumerRecord<String, String> r : held) c.acknowledge(r, AcknowledgeType.ACCEPT);
            for (Optional<KafkaException> e : c.commitSync().values()) if (e.isPresent()) {
                System.out.println("accept_error " + e.get());
            }
            accepted = held.size();
        }
        System.out.println("held " + String.join(",", values));
        System.out.println("renewals " + renewals);
        System.out.println("renew_errors " + renewErrors);
        System.out.println("again " + String.join(",", again));
        System.out.println("accepted " + accepted);
    }
}
