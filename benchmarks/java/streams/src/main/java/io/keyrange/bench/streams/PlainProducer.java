package io.keyrange.bench.streams;

import java.time.Duration;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Writes {@code --records} keyed records to {@code --topic} at {@code --rate} records per
 * second (0: as fast as it can), with {@code acks=all} and idempotence, and prints every
 * acknowledgement, so that a checker can hold consumers to exactly what the broker
 * acknowledged.
 *
 * <p>Record {@code i} (counting from {@code --first}, default 0) has the key
 * {@code k<i mod --keys>} and the value {@code <i>}, padded with spaces after the number up
 * to {@code --value-bytes}. Usage: {@code PlainProducer --bootstrap H:P --topic T --records N
 * [--keys 100] [--rate 0] [--first 0] [--partition P] [--value-bytes 0]
 * [--close-timeout-ms 30000] [--config key=value]...}.
 *
 * <p>Lines on stdout (tab-separated; keys escaped as {@link Lines#escape} does):
 * <pre>
 * ack   partition  offset  key  i              acknowledged by the broker
 * fail  key  i  Class: message                 given up (it may or may not be in the log)
 * done  ms  sent  acked  failed                after the last callback; ms since start
 * </pre>
 * SIGTERM or SIGINT stops sending; what was sent is still flushed and reported, then
 * {@code done} is printed and the exit code is 0 (1 if any record failed, 2 on a bad
 * command line).
 */
public final class PlainProducer {
    private static volatile boolean stopping;

    private PlainProducer() {
    }

    public static void main(String[] args) {
        Signals.quietLogs();
        Options options;
        try {
            options = new Options(args, "bootstrap", "topic", "records", "keys", "rate", "first", "partition",
                    "value-bytes", "close-timeout-ms");
            options.required("bootstrap");
            options.required("topic");
            options.required("records");
        } catch (IllegalArgumentException e) {
            System.err.println("PlainProducer: " + e.getMessage());
            System.exit(2);
            return;
        }
        Signals.onStop(() -> stopping = true);
        System.exit(run(options));
    }

    static int run(Options options) {
        String topic = options.required("topic");
        long records = options.getLong("records", 0);
        long keys = Math.max(1, options.getLong("keys", 100));
        double rate = options.getDouble("rate", 0);
        long first = options.getLong("first", 0);
        int partition = (int) options.getLong("partition", -1);
        int valueBytes = (int) options.getLong("value-bytes", 0);

        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, options.required("bootstrap"));
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        props.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        props.putAll(options.configs());

        AtomicLong acked = new AtomicLong();
        AtomicLong failed = new AtomicLong();
        long sent = 0;
        long start = System.nanoTime();
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            for (long n = 0; n < records && !stopping; n++) {
                if (rate > 0) {
                    long due = start + (long) (n * 1e9 / rate);
                    long left;
                    while ((left = due - System.nanoTime()) > 0 && !stopping) {
                        LockSupport.parkNanos(Math.min(left, 50_000_000L));
                    }
                    if (stopping) {
                        break;
                    }
                }
                long i = first + n;
                String key = "k" + (i % keys);
                String value = pad(Long.toString(i), valueBytes);
                ProducerRecord<String, String> record = partition >= 0
                        ? new ProducerRecord<>(topic, partition, key, value)
                        : new ProducerRecord<>(topic, key, value);
                try {
                    producer.send(record, (metadata, error) -> {
                        if (error == null) {
                            acked.incrementAndGet();
                            Lines.line("ack", metadata.partition(), metadata.offset(), Lines.escape(key), i);
                        } else {
                            failed.incrementAndGet();
                            Lines.line("fail", Lines.escape(key), i, Lines.describe(error));
                        }
                    });
                } catch (RuntimeException error) {
                    failed.incrementAndGet();
                    Lines.line("fail", Lines.escape(key), i, Lines.describe(error));
                }
                sent++;
            }
            producer.flush();
            producer.close(Duration.ofMillis(options.getLong("close-timeout-ms", 30_000)));
        }
        Lines.line("done", Lines.elapsedMillis(), sent, acked.get(), failed.get());
        return failed.get() == 0 ? 0 : 1;
    }

    private static String pad(String text, int length) {
        if (text.length() >= length) {
            return text;
        }
        return text + " ".repeat(length - text.length());
    }
}
