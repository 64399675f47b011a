// A standard Java consumer as a member of the groups benchmark's rebalance run, the
// counterpart of harness/group_member.py (the same work model and the same event lines),
// run as a single source file against the harness's Kafka jars:
//
//   java -cp '<libs>/*' benchmarks/GroupMember.java BOOTSTRAP GROUP TOPIC NAME EVENTS STOP WORK_MS
//
// It subscribes with cooperative-sticky only, and for each poll's records waits WORK_MS per
// record, the deadlines chained from the poll's return (so timer granularity is not counted
// as work), then commits asynchronously. Lines appended to EVENTS, times in seconds of
// System.nanoTime(), which on Linux is CLOCK_MONOTONIC, the clock of Python's
// time.monotonic(): the parent puts both kinds of member on one timeline.
//
//   J <time>                                  subscribed
//   P <first finish> <last finish> <count>    one poll's records processed
//   A|R|L <name> <time> <partitions>          assigned, revoked, lost (the listener's calls)

import java.io.FileOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.Collection;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.locks.LockSupport;
import java.util.stream.Collectors;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.CooperativeStickyAssignor;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class GroupMember {
    private static FileOutputStream events;

    private static double now() {
        return System.nanoTime() / 1e9;
    }

    private static synchronized void line(String text) {
        try {
            events.write((text + "\n").getBytes(StandardCharsets.US_ASCII));  // one write: whole lines
        } catch (IOException e) {
            throw new RuntimeException(e);
        }
    }

    private static String names(Collection<TopicPartition> partitions) {
        String text = partitions.stream().map(tp -> tp.topic() + "-" + tp.partition()).sorted()
                .collect(Collectors.joining(","));
        return text.isEmpty() ? "nothing" : text;
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 7) {
            System.err.println("usage: GroupMember BOOTSTRAP GROUP TOPIC NAME EVENTS STOP WORK_MS");
            System.exit(2);
        }
        String topic = args[2];
        String name = args[3];
        Path stop = Path.of(args[5]);
        long work = (long) (Double.parseDouble(args[6]) * 1_000_000);
        events = new FileOutputStream(args[4], true);
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
        props.put(ConsumerConfig.GROUP_ID_CONFIG, args[1]);
        props.put(ConsumerConfig.CLIENT_ID_CONFIG, name);
        props.put(ConsumerConfig.PARTITION_ASSIGNMENT_STRATEGY_CONFIG, CooperativeStickyAssignor.class.getName());
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "50");
        props.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, "500");
        props.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "10000");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
            consumer.subscribe(List.of(topic), new ConsumerRebalanceListener() {
                @Override
                public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
                    line(String.format("A %s %.6f %s", name, now(), names(consumer.assignment())));
                }

                @Override
                public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
                    consumer.commitSync();  // what was processed of them is committed before they move
                    line(String.format("R %s %.6f %s", name, now(), names(partitions)));
                }

                @Override
                public void onPartitionsLost(Collection<TopicPartition> partitions) {
                    line(String.format("L %s %.6f %s", name, now(), names(partitions)));
                }
            });
            line(String.format("J %.6f", now()));
            while (!Files.exists(stop)) {
                ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(200));
                long due = System.nanoTime();
                double first = 0, last = 0;
                int count = 0;
                for (ConsumerRecord<byte[], byte[]> record : records) {
                    due += work;
                    for (long left = due - System.nanoTime(); left > 0; left = due - System.nanoTime()) {
                        LockSupport.parkNanos(left);  // the slow service call
                    }
                    last = now();
                    if (count++ == 0) {
                        first = last;
                    }
                }
                if (count > 0) {
                    line(String.format("P %.6f %.6f %d", first, last, count));
                    consumer.commitAsync();
                }
            }
            consumer.commitSync();
        }
        events.close();
    }
}
