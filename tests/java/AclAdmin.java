// Kafka's Java AdminClient (kafka-clients, the version Spark ships) against the appliance's ACL
// APIs: createAcls, describeAcls, deleteAcls. Compiled and run by tests/integration/test_acls.py (java_program).
//
//   java AclAdmin BOOTSTRAP roundtrip   create, describe (ANY and MATCH), refuse a bad Cluster
//                                       name, delete; one line per step on stdout
//   java AclAdmin BOOTSTRAP refused     describe and create as a principal without Describe and
//                                       Alter on the Cluster; prints the exceptions' classes

import java.util.Collection;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.ExecutionException;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AccessControlEntryFilter;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclBindingFilter;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourcePatternFilter;
import org.apache.kafka.common.resource.ResourceType;

public class AclAdmin {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("request.timeout.ms", "20000");
        props.put("default.api.timeout.ms", "30000");
        try (Admin admin = Admin.create(props)) {
            if (args[1].equals("roundtrip")) {
                roundtrip(admin);
            } else {
                refused(admin);
            }
        }
    }

    static void roundtrip(Admin admin) throws Exception {
        AclBinding write = new AclBinding(
            new ResourcePattern(ResourceType.TOPIC, "java-", PatternType.PREFIXED),
            new AccessControlEntry("User:java", "*", AclOperation.WRITE, AclPermissionType.ALLOW));
        AclBinding deny = new AclBinding(
            new ResourcePattern(ResourceType.TRANSACTIONAL_ID, "java-tx", PatternType.LITERAL),
            new AccessControlEntry("User:java", "10.0.0.1", AclOperation.ALL, AclPermissionType.DENY));
        admin.createAcls(List.of(write, deny)).all().get();
        System.out.println("created 2");
        Collection<AclBinding> all = admin.describeAcls(AclBindingFilter.ANY).values().get();
        System.out.println("described " + all.size() + " " + all.contains(write) + " " + all.contains(deny));
        AclBindingFilter match = new AclBindingFilter(
            new ResourcePatternFilter(ResourceType.TOPIC, "java-orders", PatternType.MATCH),
            AccessControlEntryFilter.ANY);
        Collection<AclBinding> matched = admin.describeAcls(match).values().get();
        System.out.println("matched " + matched.size() + " " + matched.contains(write));
        AclBinding badCluster = new AclBinding(
            new ResourcePattern(ResourceType.CLUSTER, "not-kafka-cluster", PatternType.LITERAL),
            new AccessControlEntry("User:java", "*", AclOperation.ALTER, AclPermissionType.ALLOW));
        try {
            admin.createAcls(List.of(badCluster)).all().get();
            System.out.println("bad cluster accepted");
        } catch (ExecutionException e) {
            System.out.println("bad cluster " + e.getCause().getClass().getSimpleName());
        }
        Collection<AclBinding> deleted = admin.deleteAcls(List.of(AclBindingFilter.ANY)).all().get();
        System.out.println("deleted " + deleted.size());
        System.out.println("left " + admin.describeAcls(AclBindingFilter.ANY).values().get().size());
    }

    static void refused(Admin admin) throws Exception {
        try {
            admin.describeAcls(AclBindingFilter.ANY).values().get();
            System.out.println("describe allowed");
        } catch (ExecutionException e) {
            System.out.println("describe " + e.getCause().getClass().getSimpleName());
        }
        AclBinding any = new AclBinding(
            new ResourcePattern(ResourceType.TOPIC, "t", PatternType.LITERAL),
            new AccessControlEntry("User:java", "*", AclOperation.READ, AclPermissionType.ALLOW));
        try {
            admin.createAcls(List.of(any)).all().get();
            System.out.println("create allowed");
        } catch (ExecutionException e) {
            System.out.println("create " + e.getCause().getClass().getSimpleName());
        }
    }
}
