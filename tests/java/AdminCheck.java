// The Java AdminClient and KafkaConsumer (kafka-clients 3.9) against the appliance's admin APIs.
// Run by tests/integration/test_java_admin.py: prints one "name value" line per check and lets
// the Python test judge them; an unexpected exception ends it with a stack trace and exit 1.
//
//   java AdminCheck BOOTSTRAP admin       CreatePartitions, configs, DeleteRecords, log dirs,
//                                         elections and reassignments
//   java AdminCheck BOOTSTRAP commit      a group member reads 4 records and commits
//   java AdminCheck BOOTSTRAP resume      after a restart: a new member resumes (KIP-320
//                                         validation), auto.offset.reset=none

import java.time.Duration;
import java.util.*;
import java.util.concurrent.ExecutionException;

import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.*;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.serialization.*;

public class AdminCheck {
    static final String TOPIC = "java-admin";

    static void out(String name, Object value) {
        System.out.println(name + " " + value);
    }

    static String error(KafkaFuture<?> f) throws InterruptedException {
        try {
            f.get();
            return "ok";
        } catch (ExecutionException e) {
            return e.getCause().getClass().getSimpleName();
        }
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        switch (args[1]) {
            case "admin": admin(bootstrap); break;
            case "commit": consume(bootstrap, 4, true); break;
            case "resume": consume(bootstrap, 6, false); break;
            default: throw new IllegalArgumentException(args[1]);
        }
    }

    static void admin(String bootstrap) throws Exception {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(p)) {
            admin.createTopics(List.of(new NewTopic(TOPIC, 2, (short) 1))).all().get();

            out("createPartitions.4", error(admin.createPartitions(
                Map.of(TOPIC, NewPartitions.increaseTo(4))).all()));
            out("createPartitions.3", error(admin.createPartitions(
                Map.of(TOPIC, NewPartitions.increaseTo(3))).all()));
            out("partitions", admin.describeTopics(List.of(TOPIC)).allTopicNames().get()
                .get(TOPIC).partitions().size());

            ConfigResource topic = new ConfigResource(ConfigResource.Type.TOPIC, TOPIC);
            ConfigResource broker = new ConfigResource(ConfigResource.Type.BROKER, "1");
            out("alterTopic", error(admin.incrementalAlterConfigs(Map.of(topic, List.of(
                new AlterConfigOp(new ConfigEntry("retention.ms", "3600000"), AlterConfigOp.OpType.SET)))).all()));
            out("alterTopic.unknown", error(admin.incrementalAlterConfigs(Map.of(topic, List.of(
                new AlterConfigOp(new ConfigEntry("no.such.config", "1"), AlterConfigOp.OpType.SET)))).all()));
            out("alterBroker", error(admin.incrementalAlterConfigs(Map.of(broker, List.of(
                new AlterConfigOp(new ConfigEntry("log.retention.bytes", "1000000000"), AlterConfigOp.OpType.SET)))).all()));
            out("alterBroker.static", error(admin.incrementalAlterConfigs(Map.of(broker, List.of(
                new AlterConfigOp(new ConfigEntry("log.dirs", "/elsewhere"), AlterConfigOp.OpType.SET)))).all()));
            Map<ConfigResource, Config> described = admin.describeConfigs(List.of(topic, broker)).all().get();
            ConfigEntry rms = described.get(topic).get("retention.ms");
            out("topic.retention.ms", rms.value() + "/" + rms.source());
            ConfigEntry rbytes = described.get(topic).get("retention.bytes");
            out("topic.retention.bytes", rbytes.value() + "/" + rbytes.source());
            ConfigEntry brb = described.get(broker).get("log.retention.bytes");
            out("broker.log.retention.bytes", brb.value() + "/" + brb.source() + "/" + brb.isReadOnly());

            Properties pp = new Properties();
            pp.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            try (KafkaProducer<byte[], byte[]> producer =
                     new KafkaProducer<>(pp, new ByteArraySerializer(), new ByteArraySerializer())) {
                for (int i = 0; i < 20; i++) {
                    producer.send(new ProducerRecord<>(TOPIC, 0, null, ("v" + i).getBytes())).get();
                }
            }
            TopicPartition tp0 = new TopicPartition(TOPIC, 0);
            out("deleteRecords", admin.deleteRecords(Map.of(tp0, RecordsToDelete.beforeOffset(12)))
                .lowWatermarks().get(tp0).get().lowWatermark());
            out("earliest", admin.listOffsets(Map.of(tp0, OffsetSpec.earliest())).all().get()
                .get(tp0).offset());
            out("deleteRecords.past", error(admin.deleteRecords(
                Map.of(tp0, RecordsToDelete.beforeOffset(99))).all()));

            Map<String, LogDirDescription> dirs = admin.describeLogDirs(List.of(1)).allDescriptions().get().get(1);
            for (Map.Entry<String, LogDirDescription> d : dirs.entrySet()) {
                ReplicaInfo r = d.getValue().replicaInfos().get(tp0);
                out("logDir", d.getKey() + " " + (r == null ? -1 : r.size()) + " "
                    + d.getValue().totalBytes().isPresent());
            }

            Optional<Throwable> elected = admin.electLeaders(ElectionType.PREFERRED, Set.of(tp0))
                .partitions().get().get(tp0);
            out("electLeaders", elected.map(t -> t.getClass().getSimpleName()).orElse("ok"));
            out("reassign.same", error(admin.alterPartitionReassignments(Map.of(tp0, Optional.of(
                new NewPartitionReassignment(List.of(1))))).all()));
            out("reassign.other", error(admin.alterPartitionReassignments(Map.of(tp0, Optional.of(
                new NewPartitionReassignment(List.of(2))))).all()));
            out("reassign.cancel", error(admin.alterPartitionReassignments(Map.of(tp0,
                Optional.<NewPartitionReassignment>empty())).all()));
            out("reassignments", admin.listPartitionReassignments().reassignments().get().size());
        }
    }

    static void consume(String bootstrap, int n, boolean commit) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ConsumerConfig.GROUP_ID_CONFIG, "java-epochs");
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, commit ? "earliest" : "none");
        p.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, String.valueOf(n));
        TopicPartition tp = new TopicPartition("java-epochs", 0);
        try (KafkaConsumer<byte[], byte[]> c =
                 new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            c.subscribe(List.of("java-epochs"));
            List<Long> offsets = new ArrayList<>();
            long deadline = System.currentTimeMillis() + 60000;
            ConsumerRecord<byte[], byte[]> last = null;
            while (offsets.size() < n && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(500))) {
                    if (offsets.size() < n) {
                        offsets.add(r.offset());
                        last = r;
                    }
                }
            }
            out("offsets", offsets);
            out("leaderEpoch", last == null ? "none" : last.leaderEpoch());
            if (commit && last != null) {
                c.commitSync(Map.of(tp, new OffsetAndMetadata(last.offset() + 1, last.leaderEpoch(), "")));
                OffsetAndMetadata m = c.committed(Set.of(tp)).get(tp);
                out("committed", m.offset() + "/" + m.leaderEpoch());
            }
        }
    }
}
