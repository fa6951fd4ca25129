// The KIP-932 share-group admin calls of kafka-clients 4.3's Admin, in the order an operator
// would make them on an empty share group that has read TOPIC (one partition):
// listGroups(forShareGroups), describeShareGroups, listShareGroupOffsets (v1, all partitions),
// alterShareGroupOffsets (partition 0 to RESET), listShareGroupOffsets again,
// deleteShareGroupOffsets (the topic), deleteShareGroups, listGroups once more.
// Prints one line per step: listed <id:type:state,...>, state <s>, offsets <p:start:lag,...>,
// altered ok|<exception>, reset <p:start:lag,...>, deleted ok|<exception>, after <...>,
// gone ok|<exception>, finally <id,...>.
// Args: bootstrap group topic reset
import java.util.*;
import java.util.concurrent.ExecutionException;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.common.TopicPartition;

public class ShareAdmin4 {
    static String offsets(Admin admin, String group) throws Exception {
        Map<TopicPartition, SharePartitionOffsetInfo> m = admin.listShareGroupOffsets(
            Map.of(group, new ListShareGroupOffsetsSpec())).partitionsToOffsetInfo(group).get();
        List<String> out = new ArrayList<>();
        for (Map.Entry<TopicPartition, SharePartitionOffsetInfo> e : new TreeMap<TopicPartition, SharePartitionOffsetInfo>(
                Comparator.comparing(TopicPartition::toString)) {{ putAll(m); }}.entrySet())
            out.add(e.getKey().partition() + ":" + e.getValue().startOffset() + ":"
                    + e.getValue().lag().map(String::valueOf).orElse("none"));
        return String.join(",", out);
    }

    static String attempt(Runnable0 r) {
        try {
            r.run();
            return "ok";
        } catch (ExecutionException e) {
            return e.getCause().getClass().getSimpleName();
        } catch (Exception e) {
            return e.getClass().getSimpleName();
        }
    }

    interface Runnable0 { void run() throws Exception; }

    static String listed(Admin admin) throws Exception {
        List<String> out = new ArrayList<>();
        for (GroupListing g : admin.listGroups(ListGroupsOptions.forShareGroups()).all().get())
            out.add(g.groupId() + ":" + g.type().map(Object::toString).orElse("?") + ":"
                    + g.groupState().map(Object::toString).orElse("?"));
        Collections.sort(out);
        return String.join(",", out);
    }

    public static void main(String[] a) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", a[0]);
        String group = a[1], topic = a[2];
        long reset = Long.parseLong(a[3]);
        try (Admin admin = Admin.create(p)) {
            System.out.println("listed " + listed(admin));
            System.out.println("state " + admin.describeShareGroups(List.of(group))
                .describedGroups().get(group).get().groupState());
            System.out.println("offsets " + offsets(admin, group));
            System.out.println("altered " + attempt(() -> admin.alterShareGroupOffsets(group,
                Map.of(new TopicPartition(topic, 0), reset)).all().get()));
            System.out.println("reset " + offsets(admin, group));
            System.out.println("deleted " + attempt(() ->
                admin.deleteShareGroupOffsets(group, Set.of(topic)).all().get()));
            System.out.println("after " + offsets(admin, group));
            System.out.println("gone " + attempt(() ->
                admin.deleteShareGroups(List.of(group)).all().get()));
            System.out.println("finally " + listed(admin));
        }
    }
}
