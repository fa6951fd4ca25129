// KIP-890 / KIP-1050 with kafka-clients 4.3 against a broker at transaction.version 1 (Produce
// v11, EndTxn v4, the KIP-98 protocol with verification): the producer sends to a partition it
// never added to its transaction (the state a client bug or a lost AddPartitionsToTxn leaves: set
// here through the producer's TransactionManager, the one thing this program does that a client
// would not). The broker's verification answers TRANSACTION_ABORTABLE; the producer is not fenced:
// the application aborts and commits the next transaction with the same producer.
// Prints "send1 <exception>", "commit1 <exception>/<cause>", "abort1 ok", "commit2 ok",
// "pid <producer id>/<epoch>" after initTransactions and "pid2 ..." at the end.
import java.lang.reflect.Field;
import java.lang.reflect.Method;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringSerializer;

public class TxnAbortable4 {
    static Object field(Object o, String name) throws Exception {
        Field f = o.getClass().getDeclaredField(name);
        f.setAccessible(true);
        return f.get(o);
    }

    static String pid(Object tm) throws Exception {
        Method m = tm.getClass().getDeclaredMethod("producerIdAndEpoch");
        m.setAccessible(true);
        Object pe = m.invoke(tm);
        return field(pe, "producerId") + "/" + field(pe, "epoch");
    }

    @SuppressWarnings("unchecked")
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0], topic = args[1], txnId = args[2];
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("transactional.id", txnId);
        p.put("key.serializer", StringSerializer.class.getName());
        p.put("value.serializer", StringSerializer.class.getName());
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
            producer.initTransactions();
            Object tm = field(producer, "transactionManager");
            System.out.println("pid " + pid(tm));
            producer.beginTransaction();
            producer.send(new ProducerRecord<>(topic, 0, "k", "t1-p0")).get();
            TopicPartition p1 = new TopicPartition(topic, 1);
            synchronized (tm) {
                ((Set<TopicPartition>) field(tm, "partitionsInTransaction")).add(p1);
                Object map = field(tm, "txnPartitionMap");
                Method create = map.getClass().getDeclaredMethod("getOrCreate", TopicPartition.class);
                create.setAccessible(true);
                create.invoke(map, p1);
            }
            try {
                producer.send(new ProducerRecord<>(topic, 1, "k", "t1-p1")).get();
                System.out.println("send1 ok");
            } catch (ExecutionException e) {
                System.out.println("send1 " + e.getCause().getClass().getSimpleName());
            }
            try {
                producer.commitTransaction();
                System.out.println("commit1 ok");
            } catch (KafkaException e) {
                Throwable cause = e.getCause() == null ? e : e.getCause();
                System.out.println("commit1 " + e.getClass().getSimpleName() + "/" + cause.getClass().getSimpleName());
            }
            producer.abortTransaction();
            System.out.println("abort1 ok");
            producer.beginTransaction();
            producer.send(new ProducerRecord<>(topic, 0, "k", "t2-p0")).get();
            producer.send(new ProducerRecord<>(topic, 1, "k", "t2-p1")).get();
            producer.commitTransaction();
            System.out.println("commit2 ok");
            System.out.println("pid2 " + pid(tm));
        }
    }
}
