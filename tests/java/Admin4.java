// The Java Admin of kafka-clients 4.3 on Kafka 4.x's admin surface: describeTopics (which asks
// DescribeTopicPartitions first, paging with its cursor), listConfigResources (KIP-1142),
// CLIENT_METRICS resources through incrementalAlterConfigs/describeConfigs (what
// kafka-client-metrics.sh calls), describeCluster with the cluster's authorized operations.
// Run by tests/integration/test_java_admin.py: one "name value" line per check.

import java.util.*;
import java.util.stream.Collectors;

import org.apache.kafka.clients.admin.*;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.config.ConfigResource;

public class Admin4 {
    static void out(String name, Object value) {
        System.out.println(name + " " + value);
    }

    public static void main(String[] args) throws Exception {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        try (Admin admin = Admin.create(p)) {
            admin.createTopics(List.of(new NewTopic("dtp-a", 5, (short) 1),
                                       new NewTopic("dtp-b", 3, (short) 1))).all().get();
            // Two partitions a response: the Admin follows NextCursor through both topics.
            Map<String, TopicDescription> d = admin.describeTopics(List.of("dtp-a", "dtp-b"),
                new DescribeTopicsOptions().partitionSizeLimitPerResponse(2)
                    .includeAuthorizedOperations(true)).allTopicNames().get();
            for (String t : List.of("dtp-a", "dtp-b")) {
                TopicDescription td = d.get(t);
                out("partitions." + t, td.partitions().stream().map(TopicPartitionInfo::partition)
                    .map(String::valueOf).collect(Collectors.joining(",")));
                out("ops." + t, td.authorizedOperations() != null && !td.authorizedOperations().isEmpty());
            }
            ConfigResource cm = new ConfigResource(ConfigResource.Type.CLIENT_METRICS, "java-sub");
            admin.incrementalAlterConfigs(Map.of(cm, List.of(
                new AlterConfigOp(new ConfigEntry("metrics", "org.apache.kafka.producer."), AlterConfigOp.OpType.SET),
                new AlterConfigOp(new ConfigEntry("interval.ms", "5000"), AlterConfigOp.OpType.SET),
                new AlterConfigOp(new ConfigEntry("match", "client_id=java-.*"), AlterConfigOp.OpType.SET))))
                .all().get();
            Config c = admin.describeConfigs(List.of(cm)).all().get().get(cm);
            out("clientMetrics", c.entries().stream().map(e -> e.name() + "=" + e.value() + "/" + e.source())
                .sorted().collect(Collectors.joining(";")));
            Collection<ConfigResource> listed = admin.listConfigResources(
                Set.of(ConfigResource.Type.CLIENT_METRICS), new ListConfigResourcesOptions()).all().get();
            out("listed", listed.stream().map(r -> r.type() + ":" + r.name()).sorted()
                .collect(Collectors.joining(",")));
            Collection<ConfigResource> all = admin.listConfigResources().all().get();
            out("listedTopics", all.stream().filter(r -> r.type() == ConfigResource.Type.TOPIC)
                .map(ConfigResource::name).sorted().collect(Collectors.joining(",")));
            DescribeClusterResult cl = admin.describeCluster(
                new DescribeClusterOptions().includeAuthorizedOperations(true));
            out("clusterOps", cl.authorizedOperations().get() != null
                && !cl.authorizedOperations().get().isEmpty());
        }
    }
}
