// The chaos workload's Java clients (loadtests/chaos_java.py runs them; issue 34): Kafka's own
// client (kafka-clients 3.9.1 or 4.3.0, whichever jars are on the class path) doing what the
// Python clients of loadtests/chaos_clients.py do, each completed operation one JSON line on
// stdout in the checker's history format (loadtests/queue_checker.py). "stop" on stdin (or its
// end) ends the program after the operation in progress.
//
//   java ChaosClient producer BOOTSTRAP TOPIC PARTITIONS NAME SEED ABORT_P MAX_SENDS
//       a transactional producer: each transaction sends 1..MAX_SENDS unique values
//       "<process>-<n>" to random partitions, waits for their acks, then commits, or aborts
//       with probability ABORT_P. Outcome ok / fail (aborted, or commit never asked for) /
//       info (commit asked for, outcome unknown: the producer is replaced, its successor's
//       initTransactions fences it, and the process is renamed NAME.<generation>).
//   java ChaosClient consumer BOOTSTRAP TOPIC PARTITIONS NAME GROUP
//       a read_committed consumer: GROUP "-" assigns every partition from the beginning (no
//       group), else subscribes in GROUP and commits synchronously after each poll that
//       returned records; rebalances are reported with the poll.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Random;
import java.util.Set;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.InvalidProducerEpochException;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.errors.TimeoutException;
import org.apache.kafka.common.errors.WakeupException;

public class ChaosClient {
    static volatile boolean stop = false;
    static volatile KafkaConsumer<String, String> current = null;

    static synchronized void emit(String line) {
        System.out.println(line);
        System.out.flush();
    }

    static String q(String s) {
        return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
    }

    static void error(String process, String what, Throwable e) {
        emit("{\"f\": \"error\", \"process\": " + q(process) + ", \"value\": " + q(what + ": " + e.getClass().getSimpleName()) + "}");
    }

    public static void main(String[] args) throws Exception {
        Thread stdin = new Thread(() -> {
            try (BufferedReader r = new BufferedReader(new InputStreamReader(System.in))) {
                String line;
                while ((line = r.readLine()) != null && !line.trim().equals("stop")) { }
            } catch (Exception e) { }
            stop = true;
            KafkaConsumer<String, String> c = current;
            if (c != null) c.wakeup();
        });
        stdin.setDaemon(true);
        stdin.start();
        if (args[0].equals("producer")) {
            producer(args[1], args[2], Integer.parseInt(args[3]), args[4], Long.parseLong(args[5]),
                     Double.parseDouble(args[6]), Integer.parseInt(args[7]));
        } else {
            consumer(args[1], args[2], Integer.parseInt(args[3]), args[4], args[5]);
        }
        System.exit(0);
    }

    static Properties common(String bootstrap) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("reconnect.backoff.ms", "100");
        p.put("reconnect.backoff.max.ms", "1000");
        p.put("request.timeout.ms", "10000");
        p.put("socket.connection.setup.timeout.ms", "5000");
        p.put("metadata.max.age.ms", "5000");
        return p;
    }

    // -- the transactional producer ---------------------------------------------------------
    static KafkaProducer<String, String> newProducer(String bootstrap, String tid) {
        while (!stop) {
            Properties p = common(bootstrap);
            p.put("transactional.id", tid);
            p.put("acks", "all");
            p.put("linger.ms", "2");
            p.put("transaction.timeout.ms", "20000");
            p.put("delivery.timeout.ms", "15000");
            p.put("max.block.ms", "20000");
            p.put("key.serializer", "org.apache.kafka.common.serialization.StringSerializer");
            p.put("value.serializer", "org.apache.kafka.common.serialization.StringSerializer");
            KafkaProducer<String, String> pr = new KafkaProducer<>(p);
            try {
                pr.initTransactions();
                return pr;
            } catch (Exception e) {
                error(tid, "initTransactions", e);
                pr.close(Duration.ZERO);
                sleep(500);
            }
        }
        return null;
    }

    static void producer(String bootstrap, String topic, int partitions, String name, long seed,
                         double abortP, int maxSends) {
        Random rng = new Random(seed);
        String tid = "chaos-" + name;
        int generation = 0;
        long counter = 0;
        KafkaProducer<String, String> pr = newProducer(bootstrap, tid);
        while (!stop && pr != null) {
            String process = generation == 0 ? name : name + "." + generation;
            int n = 1 + rng.nextInt(maxSends);
            int[] parts = new int[n];
            String[] values = new String[n];
            long[] offsets = new long[n];
            for (int i = 0; i < n; i++) {
                parts[i] = rng.nextInt(partitions);
                values[i] = process + "-" + (++counter);
                offsets[i] = -1;
            }
            String outcome = "fail";
            boolean replace = false;
            boolean abort = rng.nextDouble() < abortP;
            try {
                pr.beginTransaction();
                List<Future<RecordMetadata>> fs = new ArrayList<>();
                for (int i = 0; i < n; i++)
                    fs.add(pr.send(new ProducerRecord<>(topic, parts[i], null, values[i])));
                for (int i = 0; i < n; i++)
                    offsets[i] = fs.get(i).get(30, TimeUnit.SECONDS).offset();
            } catch (Exception e) {
                // Before the commit was asked for: the transaction cannot have committed.
                error(process, "in transaction", e);
                abort = true;
                replace = e instanceof ProducerFencedException || e.getCause() instanceof ProducerFencedException;
            }
            if (abort && !replace) {
                try {
                    pr.abortTransaction();
                } catch (Exception e) {
                    error(process, "abortTransaction", e);
                    replace = true;
                }
            } else if (!abort) {
                outcome = "info";
                for (int attempt = 0; attempt < 3; attempt++) {
                    try {
                        pr.commitTransaction();
                        outcome = "ok";
                        break;
                    } catch (TimeoutException e) {
                        error(process, "commitTransaction", e);       // may be retried
                    } catch (ProducerFencedException | InvalidProducerEpochException e) {
                        error(process, "commitTransaction", e);
                        break;
                    } catch (KafkaException e) {
                        error(process, "commitTransaction", e);
                        try {                                       // abortable: abort it
                            pr.abortTransaction();
                            outcome = "fail";
                        } catch (Exception e2) {
                            error(process, "abortTransaction", e2);
                        }
                        break;
                    }
                }
                replace = outcome.equals("info");
            }
            StringBuilder sb = new StringBuilder();
            sb.append("{\"process\": ").append(q(process)).append(", \"type\": ").append(q(outcome))
              .append(", \"f\": \"txn\", \"value\": [");
            for (int i = 0; i < n; i++) {
                if (i > 0) sb.append(", ");
                sb.append("[\"send\", ").append(q(topic + "-" + parts[i])).append(", [")
                  .append(offsets[i] < 0 ? "null" : Long.toString(offsets[i])).append(", ").append(q(values[i])).append("]]");
            }
            emit(sb.append("]}").toString());
            if (replace) {
                pr.close(Duration.ZERO);
                generation++;
                pr = newProducer(bootstrap, tid);
            }
        }
        if (pr != null) pr.close(Duration.ofSeconds(5));
    }

    // -- the read_committed consumer ----------------------------------------------------------
    static void consumer(String bootstrap, String topic, int partitions, String name, String group) {
        int generation = 0;
        while (!stop) {
            String process = generation == 0 ? name : name + "." + generation;
            Properties p = common(bootstrap);
            p.put("isolation.level", "read_committed");
            p.put("enable.auto.commit", "false");
            p.put("auto.offset.reset", "earliest");
            p.put("session.timeout.ms", "6000");
            p.put("heartbeat.interval.ms", "500");
            p.put("max.poll.interval.ms", "120000");
            p.put("fetch.max.wait.ms", "200");
            p.put("key.deserializer", "org.apache.kafka.common.serialization.StringDeserializer");
            p.put("value.deserializer", "org.apache.kafka.common.serialization.StringDeserializer");
            if (!group.equals("-")) p.put("group.id", group);
            Set<String> rebalanced = new HashSet<>();
            try (KafkaConsumer<String, String> c = new KafkaConsumer<>(p)) {
                current = c;
                if (stop) break;
                if (group.equals("-")) {
                    List<TopicPartition> tps = new ArrayList<>();
                    for (int i = 0; i < partitions; i++) tps.add(new TopicPartition(topic, i));
                    c.assign(tps);
                    c.seekToBeginning(tps);
                } else {
                    c.subscribe(List.of(topic), new ConsumerRebalanceListener() {
                        public void onPartitionsRevoked(Collection<TopicPartition> ps) { mark(ps); }
                        public void onPartitionsAssigned(Collection<TopicPartition> ps) { mark(ps); }
                        public void onPartitionsLost(Collection<TopicPartition> ps) { mark(ps); }
                        void mark(Collection<TopicPartition> ps) {
                            for (TopicPartition tp : ps) rebalanced.add(tp.topic() + "-" + tp.partition());
                        }
                    });
                }
                while (!stop) {
                    ConsumerRecords<String, String> rs = c.poll(Duration.ofMillis(500));
                    if (rs.isEmpty() && rebalanced.isEmpty()) continue;
                    Map<String, List<String>> reads = new LinkedHashMap<>();
                    for (ConsumerRecord<String, String> r : rs)
                        reads.computeIfAbsent(r.topic() + "-" + r.partition(), k -> new ArrayList<>())
                             .add("[" + r.offset() + ", " + q(r.value()) + "]");
                    StringBuilder sb = new StringBuilder();
                    sb.append("{\"process\": ").append(q(process)).append(", \"type\": \"ok\", \"f\": \"poll\", \"value\": [[\"poll\", {");
                    boolean first = true;
                    for (Map.Entry<String, List<String>> e : reads.entrySet()) {
                        if (!first) sb.append(", ");
                        first = false;
                        sb.append(q(e.getKey())).append(": [").append(String.join(", ", e.getValue())).append("]");
                    }
                    sb.append("}]]");
                    if (!rebalanced.isEmpty()) {
                        List<String> ks = new ArrayList<>();
                        for (String k : rebalanced) ks.add(q(k));
                        sb.append(", \"rebalance\": [").append(String.join(", ", ks)).append("]");
                        rebalanced.clear();
                    }
                    emit(sb.append("}").toString());
                    if (!rs.isEmpty() && !group.equals("-")) {
                        try {
                            c.commitSync(Duration.ofSeconds(10));
                        } catch (WakeupException e) {
                            break;
                        } catch (Exception e) {
                            error(process, "commitSync", e);
                        }
                    }
                }
            } catch (WakeupException e) {
                break;
            } catch (Exception e) {
                // A new consumer, a new history process (its reads start anywhere).
                error(process, "consumer", e);
                generation++;
                sleep(500);
            } finally {
                current = null;
            }
        }
    }

    static void sleep(long ms) {
        try { Thread.sleep(ms); } catch (InterruptedException e) { }
    }
}
