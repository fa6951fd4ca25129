// The Java client (kafka-clients 3.9.1, the version Spark 4 ships) against the appliance over
// SASL_SSL with SCRAM: the AdminClient's SCRAM credential calls, an idempotent producer, a
// transactional producer (commit and abort) and a read_committed consumer group.
// Compiled and run by tests/integration/test_java_client.py; prints what it saw, one fact per
// line, and exits non-zero on any failure.

import java.time.Duration;
import java.util.*;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.serialization.*;

public class SecureClients {
    static Properties base(String bootstrap, String ca, String mechanism, String user, String password) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("security.protocol", "SASL_SSL");
        p.put("sasl.mechanism", mechanism);
        p.put("sasl.jaas.config", "org.apache.kafka.common.security.scram.ScramLoginModule required "
              + "username=\"" + user + "\" password=\"" + password + "\";");
        p.put("ssl.truststore.type", "PEM");
        p.put("ssl.truststore.location", ca);
        return p;
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], ca = args[1], mechanism = args[2], user = args[3], password = args[4];
        String command = args[5];
        Properties conf = base(bootstrap, ca, mechanism, user, password);
        if (command.equals("add-user")) {
            String name = args[6], secret = args[7];
            try (Admin admin = Admin.create(conf)) {
                admin.alterUserScramCredentials(List.of(new UserScramCredentialUpsertion(
                        name, new ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192), secret)))
                    .all().get(60, TimeUnit.SECONDS);
                UserScramCredentialsDescription d = admin.describeUserScramCredentials(List.of(name))
                    .description(name).get(60, TimeUnit.SECONDS);
                for (ScramCredentialInfo info : d.credentialInfos())
                    System.out.println("described " + d.name() + " " + info.mechanism() + " " + info.iterations());
            }
            return;
        }
        String topic = args[6];
        conf.put("key.serializer", StringSerializer.class.getName());
        conf.put("value.serializer", StringSerializer.class.getName());
        try (KafkaProducer<String, String> p = new KafkaProducer<>(conf)) {
            for (int i = 0; i < 100; i++)
                p.send(new ProducerRecord<>(topic, "k" + i, "plain-" + i)).get(60, TimeUnit.SECONDS);
        }
        System.out.println("produced 100");
        Properties tx = (Properties) conf.clone();
        tx.put("transactional.id", "java-" + topic);
        try (KafkaProducer<String, String> p = new KafkaProducer<>(tx)) {
            p.initTransactions();
            p.beginTransaction();
            for (int i = 0; i < 10; i++) p.send(new ProducerRecord<>(topic, "t" + i, "committed-" + i));
            p.commitTransaction();
            p.beginTransaction();
            for (int i = 0; i < 10; i++) p.send(new ProducerRecord<>(topic, "a" + i, "aborted-" + i));
            p.flush();
            p.abortTransaction();
        }
        System.out.println("transactions done");
        Properties cc = base(bootstrap, ca, mechanism, user, password);
        cc.put("group.id", "java-" + topic);
        cc.put("auto.offset.reset", "earliest");
        cc.put("isolation.level", "read_committed");
        cc.put("enable.auto.commit", "false");
        cc.put("key.deserializer", StringDeserializer.class.getName());
        cc.put("value.deserializer", StringDeserializer.class.getName());
        int plain = 0, committed = 0, aborted = 0;
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(cc)) {
            c.subscribe(List.of(topic));
            long deadline = System.currentTimeMillis() + 60000;
            while (plain + committed < 110 && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(500))) {
                    if (r.value().startsWith("plain-")) plain++;
                    else if (r.value().startsWith("committed-")) committed++;
                    else aborted++;
                }
            }
            c.commitSync();
            OffsetAndMetadata om = c.committed(Set.of(new org.apache.kafka.common.TopicPartition(topic, 0)))
                .get(new org.apache.kafka.common.TopicPartition(topic, 0));
            System.out.println("committed offset " + (om == null ? -1 : om.offset()));
        }
        System.out.println("consumed plain " + plain + " committed " + committed + " aborted " + aborted);
    }
}
