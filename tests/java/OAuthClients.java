// The Java client's SASL/OAUTHBEARER login (KIP-768's OAuthBearerLoginCallbackHandler, the token
// read from a file: URL as Kafka's FileJwtRetriever / file token retriever does) over SASL_SSL:
// a producer and a consumer on a topic the token's principal has ACLs for, and a refusal on a
// topic it has none for. Compiled and run by tests/integration/test_sasl_oauthbearer.py; prints
// what it saw, one fact per line, and exits non-zero on any failure.
//
// Args: bootstrap, CA (PEM), token file, allowed topic, denied topic, group.

import java.time.Duration;
import java.util.*;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.errors.TopicAuthorizationException;
import org.apache.kafka.common.serialization.*;

public class OAuthClients {
    static Properties base(String bootstrap, String ca, String tokenFile) {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("security.protocol", "SASL_SSL");
        p.put("sasl.mechanism", "OAUTHBEARER");
        p.put("sasl.jaas.config",
              "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;");
        p.put("sasl.login.callback.handler.class",
              "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler");
        p.put("sasl.oauthbearer.token.endpoint.url", "file://" + tokenFile);
        p.put("ssl.truststore.type", "PEM");
        p.put("ssl.truststore.location", ca);
        return p;
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], ca = args[1], tokenFile = args[2];
        String topic = args[3], denied = args[4], group = args[5];
        // Kafka 3.9.1+ and 4.x read a token or JWKS URL only when it is allowed (CVE-2025-27817).
        System.setProperty("org.apache.kafka.sasl.oauthbearer.allowed.urls", "file://" + tokenFile);
        Properties conf = base(bootstrap, ca, tokenFile);
        conf.put("key.serializer", StringSerializer.class.getName());
        conf.put("value.serializer", StringSerializer.class.getName());
        conf.put("delivery.timeout.ms", "20000");
        conf.put("request.timeout.ms", "10000");
        conf.put("max.block.ms", "20000");
        try (KafkaProducer<String, String> p = new KafkaProducer<>(conf)) {
            for (int i = 0; i < 10; i++)
                p.send(new ProducerRecord<>(topic, "k" + i, "oauth-" + i)).get(60, TimeUnit.SECONDS);
            System.out.println("produced 10");
            try {
                p.send(new ProducerRecord<>(denied, "k", "v")).get(60, TimeUnit.SECONDS);
                System.out.println("denied-topic accepted");
            } catch (ExecutionException e) {
                System.out.println("denied-topic " + e.getCause().getClass().getSimpleName());
            }
        }
        Properties cc = base(bootstrap, ca, tokenFile);
        cc.put("group.id", group);
        cc.put("auto.offset.reset", "earliest");
        cc.put("enable.auto.commit", "false");
        cc.put("key.deserializer", StringDeserializer.class.getName());
        cc.put("value.deserializer", StringDeserializer.class.getName());
        int got = 0;
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(cc)) {
            c.subscribe(List.of(topic));
            long deadline = System.currentTimeMillis() + 60000;
            while (got < 10 && System.currentTimeMillis() < deadline)
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(500)))
                    if (r.value().startsWith("oauth-")) got++;
            c.commitSync();
        }
        System.out.println("consumed " + got);
    }
}
