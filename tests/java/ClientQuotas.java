// What kafka-configs.sh --entity-type users|clients does, through the Java Admin (KIP-546):
// alterClientQuotas (set, validate-only, an invalid key, remove) and describeClientQuotas with
// the filters kafka-configs.sh sends (containsOnly per entity type) and all().
// Usage: ClientQuotas BOOTSTRAP. Prints "name value" lines.
import java.util.*;
import java.util.concurrent.ExecutionException;
import org.apache.kafka.clients.admin.*;
import org.apache.kafka.common.quota.*;

public class ClientQuotas {
    static ClientQuotaEntity entity(String... kv) {
        Map<String, String> m = new HashMap<>();
        for (int i = 0; i < kv.length; i += 2) m.put(kv[i], kv[i + 1]);
        return new ClientQuotaEntity(m);
    }

    static String show(Map<ClientQuotaEntity, Map<String, Double>> found) {
        List<String> out = new ArrayList<>();
        for (Map.Entry<ClientQuotaEntity, Map<String, Double>> e : found.entrySet()) {
            List<String> ent = new ArrayList<>();
            for (Map.Entry<String, String> x : new TreeMap<>(e.getKey().entries()).entrySet())
                ent.add(x.getKey() + "=" + (x.getValue() == null ? "<default>" : x.getValue()));
            List<String> vals = new ArrayList<>();
            for (Map.Entry<String, Double> v : new TreeMap<>(e.getValue()).entrySet())
                vals.add(v.getKey() + "=" + v.getValue());
            out.add(String.join(",", ent) + ":" + String.join(",", vals));
        }
        Collections.sort(out);
        return String.join(";", out);
    }

    public static void main(String[] args) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", args[0]);
        try (Admin admin = Admin.create(p)) {
            ClientQuotaEntity alice = entity(ClientQuotaEntity.USER, "alice");
            ClientQuotaEntity aliceDefault = entity(ClientQuotaEntity.USER, "alice", ClientQuotaEntity.CLIENT_ID, null);
            ClientQuotaEntity defaultClient = entity(ClientQuotaEntity.CLIENT_ID, null);
            ClientQuotaEntity app = entity(ClientQuotaEntity.CLIENT_ID, "app-1");
            admin.alterClientQuotas(List.of(
                new ClientQuotaAlteration(alice, List.of(new ClientQuotaAlteration.Op("producer_byte_rate", 1048576.0),
                                                         new ClientQuotaAlteration.Op("request_percentage", 25.5))),
                new ClientQuotaAlteration(aliceDefault, List.of(new ClientQuotaAlteration.Op("consumer_byte_rate", 2048.0))),
                new ClientQuotaAlteration(defaultClient, List.of(new ClientQuotaAlteration.Op("producer_byte_rate", 4096.0))),
                new ClientQuotaAlteration(app, List.of(new ClientQuotaAlteration.Op("consumer_byte_rate", 8192.0)))
            )).all().get();
            admin.alterClientQuotas(List.of(new ClientQuotaAlteration(defaultClient,
                    List.of(new ClientQuotaAlteration.Op("consumer_byte_rate", 1.0)))),
                new AlterClientQuotasOptions().validateOnly(true)).all().get();
            try {
                admin.alterClientQuotas(List.of(new ClientQuotaAlteration(alice,
                    List.of(new ClientQuotaAlteration.Op("bogus_rate", 1.0))))).all().get();
                System.out.println("invalid none");
            } catch (ExecutionException e) {
                System.out.println("invalid " + e.getCause().getClass().getSimpleName() + ":" + e.getCause().getMessage());
            }
            System.out.println("users " + show(admin.describeClientQuotas(ClientQuotaFilter.containsOnly(
                List.of(ClientQuotaFilterComponent.ofEntityType(ClientQuotaEntity.USER)))).entities().get()));
            System.out.println("clients " + show(admin.describeClientQuotas(ClientQuotaFilter.containsOnly(
                List.of(ClientQuotaFilterComponent.ofEntityType(ClientQuotaEntity.CLIENT_ID)))).entities().get()));
            System.out.println("alice " + show(admin.describeClientQuotas(ClientQuotaFilter.contains(
                List.of(ClientQuotaFilterComponent.ofEntity(ClientQuotaEntity.USER, "alice")))).entities().get()));
            System.out.println("default " + show(admin.describeClientQuotas(ClientQuotaFilter.containsOnly(
                List.of(ClientQuotaFilterComponent.ofDefaultEntity(ClientQuotaEntity.CLIENT_ID)))).entities().get()));
            admin.alterClientQuotas(List.of(new ClientQuotaAlteration(alice,
                List.of(new ClientQuotaAlteration.Op("request_percentage", null))))).all().get();
            System.out.println("removed " + show(admin.describeClientQuotas(ClientQuotaFilter.containsOnly(
                List.of(ClientQuotaFilterComponent.ofEntity(ClientQuotaEntity.USER, "alice")))).entities().get()));
            System.out.println("all " + admin.describeClientQuotas(ClientQuotaFilter.all()).entities().get().size());
        }
    }
}
