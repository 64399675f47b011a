// A Java (kafka-clients) transactional producer doing what Kafka Streams exactly_once_v2
// does at each commit: produce, sendOffsetsToTransaction, commitTransaction, twice.
// Compiled and run by 07_client_paths.py.
//
// args: bootstrap transactionalId produceTopic offsetsTopic partition offset group maxBlockMs

import java.time.Duration;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringSerializer;

public class TxnOffsetsProbe {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("transactional.id", args[1]);
        props.put("max.block.ms", args[7]);
        props.put("key.serializer", StringSerializer.class.getName());
        props.put("value.serializer", StringSerializer.class.getName());
        TopicPartition offsets = new TopicPartition(args[3], Integer.parseInt(args[4]));
        long offset = Long.parseLong(args[5]);
        KafkaProducer<String, String> producer = new KafkaProducer<>(props);
        try {
            producer.initTransactions();
            System.out.println("initTransactions: ok");
            for (int round = 0; round < 2; round++) {
                producer.beginTransaction();
                producer.send(new ProducerRecord<>(args[2], "k" + round, "v" + round)).get();
                try {
                    producer.sendOffsetsToTransaction(Map.of(offsets, new OffsetAndMetadata(offset + round)),
                        new ConsumerGroupMetadata(args[6]));
                    producer.commitTransaction();
                    System.out.println("round " + round + ": sendOffsetsToTransaction + commitTransaction: ok");
                } catch (Exception e) {
                    System.out.println("round " + round + ": " + e.getClass().getSimpleName() + ": " + e.getMessage());
                    return;
                }
            }
        } finally {
            producer.close(Duration.ofSeconds(2));  // close() without a timeout waits for the retries forever
        }
    }
}
