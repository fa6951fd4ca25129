// A KIP-848 consumer (group.protocol=consumer) with Kafka's Java client 4.x, for
// tests/integration/test_consumer_group_protocol.py.
//
//   java Kip848Consumer BOOTSTRAP GROUP TOPIC EXPECTED [PROTOCOL]
//
// PROTOCOL is the group.protocol, consumer (the default) or classic (a classic member, which
// may also sit in a KIP-848 consumer group: tests/integration/test_group_protocol_migration.py).
// Subscribes to TOPIC in GROUP, polls until it has read EXPECTED distinct records (0: until it
// is assigned partitions) or 60 s passed,
// committing synchronously after every poll that returned records; then, still a member,
// describes the group with the Admin (describeConsumerGroups: ConsumerGroupDescribe) and lists
// the groups (listGroups, KIP-1043: ListGroups v5), and leaves (close). Prints one "name value"
// line per fact: read, duplicates, assigned, type, state, members, member_epoch, listed.
import java.time.Duration;
import java.util.*;
import java.util.stream.Collectors;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.GroupListing;
import org.apache.kafka.clients.admin.MemberDescription;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;

public class Kip848Consumer {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], group = args[1], topic = args[2];
        int expected = Integer.parseInt(args[3]);
        String protocol = args.length > 4 ? args[4] : "consumer";
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("group.id", group);
        p.put("group.protocol", protocol);
        p.put("enable.auto.commit", "false");
        p.put("auto.offset.reset", "earliest");
        p.put("key.deserializer", "org.apache.kafka.common.serialization.ByteArrayDeserializer");
        p.put("value.deserializer", "org.apache.kafka.common.serialization.ByteArrayDeserializer");
        Properties ap = new Properties();
        ap.put("bootstrap.servers", bootstrap);
        Set<String> seen = new HashSet<>();
        int duplicates = 0;
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(p); Admin admin = Admin.create(ap)) {
            c.subscribe(List.of(topic));
            long deadline = System.currentTimeMillis() + 60_000;
            while ((expected > 0 ? seen.size() < expected : c.assignment().isEmpty())
                    && System.currentTimeMillis() < deadline) {
                ConsumerRecords<byte[], byte[]> rs = c.poll(Duration.ofMillis(200));
                for (ConsumerRecord<byte[], byte[]> r : rs) {
                    if (!seen.add(r.partition() + ":" + r.offset())) duplicates++;
                }
                if (!rs.isEmpty()) c.commitSync();
            }
            System.out.println("read " + seen.size());
            System.out.println("duplicates " + duplicates);
            System.out.println("assigned " + c.assignment().stream().map(TopicPartition::partition)
                    .sorted().map(String::valueOf).collect(Collectors.joining(",")));
            ConsumerGroupDescription d = admin.describeConsumerGroups(List.of(group)).all().get().get(group);
            System.out.println("type " + d.type());
            System.out.println("state " + d.groupState());
            System.out.println("members " + d.members().size());
            for (MemberDescription m : d.members()) {
                System.out.println("member_epoch " + m.memberEpoch().orElse(-1));
                System.out.println("member_partitions " + m.assignment().topicPartitions().size());
            }
            for (GroupListing g : admin.listGroups().all().get()) {
                if (g.groupId().equals(group)) {
                    System.out.println("listed " + g.type().map(Object::toString).orElse("none"));
                }
            }
        }
        System.out.println("closed yes");
    }
}
