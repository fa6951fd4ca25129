// One catch-up reader of loadtests/bench_consume.py --client java (issue 39: Kafka's Java
// consumer at its defaults reading a topic from offset 0).
//
//   java CatchUpConsumer BOOTSTRAP TOPIC PARTITIONS START STRIDE ISOLATION [KEY=VALUE ...]
//
// Assigns the partitions START, START+STRIDE, ... below PARTITIONS (no group: assign, no
// commits), takes their end offsets, seeks to the beginning, prints "READY", waits for a line
// on stdin, then polls until every position has reached its end offset and prints
// "DONE records bytes t0 t1" (value bytes; wall-clock seconds, comparable across processes), then
// follows the tail (polling on; "TAILED n" after each poll that brought records, n read since
// DONE) until the next line or the end of stdin, prints "TAIL n", closes the consumer and prints
// "CLOSED".
// KEY=VALUE pairs are consumer settings over the client's defaults. Kafka's Java consumer fetches
// through KIP-227 fetch sessions where the broker grants them, and closes them on close.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.time.Duration;
import java.util.*;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;

public class CatchUpConsumer {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1];
        int partitions = Integer.parseInt(args[2]), start = Integer.parseInt(args[3]);
        int stride = Integer.parseInt(args[4]);
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("enable.auto.commit", "false");
        p.put("isolation.level", args[5]);
        p.put("key.deserializer", "org.apache.kafka.common.serialization.ByteArrayDeserializer");
        p.put("value.deserializer", "org.apache.kafka.common.serialization.ByteArrayDeserializer");
        for (int i = 6; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            p.put(args[i].substring(0, eq), args[i].substring(eq + 1));
        }
        List<TopicPartition> tps = new ArrayList<>();
        for (int i = start; i < partitions; i += stride) tps.add(new TopicPartition(topic, i));
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(p)) {
            c.assign(tps);
            Map<TopicPartition, Long> ends = c.endOffsets(tps, Duration.ofSeconds(120));
            c.seekToBeginning(tps);
            for (TopicPartition tp : tps) c.position(tp, Duration.ofSeconds(120));
            System.out.println("READY");
            System.out.flush();
            in.readLine();
            long got = 0, bytes = 0;
            double t0 = System.currentTimeMillis() / 1000.0;
            while (true) {
                ConsumerRecords<byte[], byte[]> rs = c.poll(Duration.ofMillis(200));
                for (ConsumerRecord<byte[], byte[]> r : rs) {
                    got++;
                    if (r.value() != null) bytes += r.value().length;
                }
                if (rs.isEmpty()) {
                    boolean done = true;
                    for (TopicPartition tp : tps) {
                        if (c.position(tp) < ends.get(tp)) { done = false; break; }
                    }
                    if (done) break;
                }
            }
            double t1 = System.currentTimeMillis() / 1000.0;
            System.out.println("DONE " + got + " " + bytes + " " + t0 + " " + t1);
            System.out.flush();
            // Then it follows the tail, polling, until a line or the end of stdin.
            java.util.concurrent.atomic.AtomicBoolean stop = new java.util.concurrent.atomic.AtomicBoolean();
            Thread reader = new Thread(() -> {
                try { in.readLine(); } catch (java.io.IOException e) { }
                stop.set(true);
            });
            reader.setDaemon(true);
            reader.start();
            long tail = 0;
            while (!stop.get()) {
                int n = c.poll(Duration.ofMillis(100)).count();
                if (n > 0) {
                    tail += n;
                    System.out.println("TAILED " + tail);
                    System.out.flush();
                }
            }
            System.out.println("TAIL " + tail);
        }
        System.out.println("CLOSED");
        System.out.flush();
    }
}
