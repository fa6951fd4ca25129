// One member of loadtests/bench_rebalance.py's group with Kafka's Java client 4.x (issue 33:
// whether the client pauses partitions that keep their owner during a rebalance).
//
//   java RebalanceMember BOOTSTRAP GROUP TOPIC PROTOCOL HEARTBEAT_MS [PROCESS_MS]
//
// PROTOCOL: consumer (KIP-848, the broker's assignor), cooperative (classic,
// CooperativeStickyAssignor) or eager (classic, RangeAssignor). Subscribes, polls, commits
// synchronously after every poll that returned records (after PROCESS_MS of "work" on them, a
// sleep: an application's time per batch), and prints, flushed:
//   "S" once subscribed (the JVM's start is not the join), "A p,p,..." partitions assigned, "R p,p,..." revoked, "L p,p,..." lost (listener calls),
//   "M p:offset p:offset ..." the records of one poll.
// A line "stop" (or the end) on stdin closes the consumer (it leaves the group), then it prints
// "CLOSED" and exits.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.time.Duration;
import java.util.*;
import java.util.stream.Collectors;

import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;

public class RebalanceMember {
    static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    static String parts(Collection<TopicPartition> ps) {
        return ps.stream().map(tp -> String.valueOf(tp.partition())).collect(Collectors.joining(","));
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], group = args[1], topic = args[2], protocol = args[3];
        int hb = Integer.parseInt(args[4]);
        int processMs = args.length > 5 ? Integer.parseInt(args[5]) : 0;
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("group.id", group);
        p.put("enable.auto.commit", "false");
        p.put("auto.offset.reset", "earliest");
        p.put("key.deserializer", "org.apache.kafka.common.serialization.ByteArrayDeserializer");
        p.put("value.deserializer", "org.apache.kafka.common.serialization.ByteArrayDeserializer");
        if (protocol.equals("consumer")) {
            p.put("group.protocol", "consumer");
        } else {
            p.put("group.protocol", "classic");
            p.put("heartbeat.interval.ms", String.valueOf(hb));
            p.put("session.timeout.ms", String.valueOf(10 * hb));
            p.put("partition.assignment.strategy", protocol.equals("cooperative")
                    ? "org.apache.kafka.clients.consumer.CooperativeStickyAssignor"
                    : "org.apache.kafka.clients.consumer.RangeAssignor");
        }
        final boolean[] stop = {false};
        Thread stdin = new Thread(() -> {
            try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in))) {
                while (true) {
                    String line = in.readLine();
                    if (line == null || line.trim().equals("stop")) break;
                }
            } catch (Exception e) {
                // the end of stdin is the stop too
            }
            synchronized (stop) { stop[0] = true; }
        });
        stdin.setDaemon(true);
        stdin.start();
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(p)) {
            c.subscribe(List.of(topic), new ConsumerRebalanceListener() {
                public void onPartitionsAssigned(Collection<TopicPartition> ps) { say("A " + parts(ps)); }
                public void onPartitionsRevoked(Collection<TopicPartition> ps) { say("R " + parts(ps)); }
                public void onPartitionsLost(Collection<TopicPartition> ps) { say("L " + parts(ps)); }
            });
            say("S");
            while (true) {
                synchronized (stop) { if (stop[0]) break; }
                ConsumerRecords<byte[], byte[]> rs = c.poll(Duration.ofMillis(50));
                if (rs.isEmpty()) continue;
                StringBuilder b = new StringBuilder("M");
                for (ConsumerRecord<byte[], byte[]> r : rs) b.append(' ').append(r.partition()).append(':').append(r.offset());
                say(b.toString());
                if (processMs > 0) Thread.sleep(processMs);
                try {
                    c.commitSync();
                } catch (Exception e) {
                    // a commit refused in a rebalance: the next poll's commit carries it
                }
            }
        }
        say("CLOSED");
    }
}
