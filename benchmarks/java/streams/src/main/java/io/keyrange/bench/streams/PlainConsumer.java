package io.keyrange.bench.streams;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.kafka.clients.consumer.CommitFailedException;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.RebalanceInProgressException;
import org.apache.kafka.common.errors.RetriableException;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * A KafkaConsumer in group {@code --group} subscribed to {@code --topic} (comma-separated
 * names allowed) that prints every record a poll hands out and then commits, with
 * {@code commitSync}, the offsets after the records of that poll: at-least-once, so a
 * checker can compare what the broker acknowledged with what was handed out.
 *
 * <p>Usage: {@code PlainConsumer --bootstrap H:P --topic T --group G [--client-id C]
 * [--max-poll-records 500] [--isolation read_uncommitted|read_committed] [--poll-ms 200]
 * [--max-seconds 3600] [--config key=value]...}. Offsets reset to the earliest; auto commit is off.
 *
 * <p>Lines on stdout (tab-separated; keys and values escaped as {@link Lines#escape} does;
 * partitions listed as {@code topic:partition} separated by commas):
 * <pre>
 * assigned  ms  partitions                    after a rebalance gave them (incrementally)
 * revoked   ms  partitions                    before they are taken away
 * lost      ms  partitions                    taken away without a chance to commit
 * rec       topic  partition  offset  key  value  t  handed out by poll (before the commit); t is
 *                                                the poll's System.nanoTime() in seconds: on Linux
 *                                                CLOCK_MONOTONIC, the clock of Python's time.monotonic()
 * commit    topic  partition  offset          committed: the next offset to read
 * commitfail  ms  Class: message              the commit of a poll failed (rebalance)
 * error     ms  Class: message                poll failed; the consumer goes on polling
 * stopped   ms  records                       after close; records handed out in all
 * </pre>
 * The {@code rec} lines of a poll are written with one system call before its commit is
 * sent, so every record whose offset was committed has been printed. SIGTERM or SIGINT
 * (or {@code --max-seconds}) ends the loop; the consumer closes (leaving the group) and the
 * exit code is 0 (1 after an error that is not retriable, 2 on a bad command line).
 */
public final class PlainConsumer {
    private static volatile boolean stopping;
    private static volatile KafkaConsumer<String, String> running;

    private PlainConsumer() {
    }

    public static void main(String[] args) {
        Signals.quietLogs();
        Options options;
        try {
            options = new Options(args, "bootstrap", "topic", "group", "client-id", "max-poll-records", "isolation",
                    "poll-ms", "max-seconds");
            options.required("bootstrap");
            options.required("topic");
            options.required("group");
        } catch (IllegalArgumentException e) {
            System.err.println("PlainConsumer: " + e.getMessage());
            System.exit(2);
            return;
        }
        Signals.onStop(() -> {
            stopping = true;
            KafkaConsumer<String, String> consumer = running;
            if (consumer != null) {
                consumer.wakeup();
            }
        });
        System.exit(run(options));
    }

    static int run(Options options) {
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, options.required("bootstrap"));
        props.put(ConsumerConfig.GROUP_ID_CONFIG, options.required("group"));
        if (options.has("client-id")) {
            props.put(ConsumerConfig.CLIENT_ID_CONFIG, options.get("client-id", ""));
        }
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, options.get("max-poll-records", "500"));
        props.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, options.get("isolation", "read_uncommitted"));
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.putAll(options.configs());

        Duration pollTimeout = Duration.ofMillis(options.getLong("poll-ms", 200));
        long deadline = System.nanoTime() + options.getLong("max-seconds", 3600) * 1_000_000_000L;
        long handedOut = 0;
        int code = 0;
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props)) {
            running = consumer;
            consumer.subscribe(Arrays.asList(options.required("topic").split(",")), new Listener());
            while (!stopping && System.nanoTime() < deadline) {
                ConsumerRecords<String, String> records;
                try {
                    records = consumer.poll(pollTimeout);
                } catch (WakeupException e) {
                    break;
                } catch (RetriableException e) {
                    Lines.line("error", Lines.elapsedMillis(), Lines.describe(e));
                    continue;
                }
                if (records.isEmpty()) {
                    try {
                        commitIdlePositions(consumer);
                    } catch (WakeupException e) {
                        break; // stopped while committing the idle positions: a stop, not an error
                    }
                    continue;
                }
                List<String> lines = new ArrayList<>(records.count());
                Map<TopicPartition, OffsetAndMetadata> next = new HashMap<>();
                String polledAt = String.format(java.util.Locale.ROOT, "%.6f", System.nanoTime() / 1e9);
                for (ConsumerRecord<String, String> record : records) {
                    lines.add(Lines.join("rec", Lines.escape(record.topic()), record.partition(), record.offset(),
                            Lines.escape(record.key()), Lines.escape(record.value()), polledAt));
                    next.put(new TopicPartition(record.topic(), record.partition()),
                            new OffsetAndMetadata(record.offset() + 1, record.leaderEpoch(), ""));
                }
                Lines.lines(lines);
                handedOut += records.count();
                try {
                    consumer.commitSync(next);
                    List<String> commits = new ArrayList<>(next.size());
                    next.forEach((tp, offset) -> commits.add(Lines.join("commit", Lines.escape(tp.topic()),
                            tp.partition(), offset.offset())));
                    Lines.lines(commits);
                } catch (WakeupException e) {
                    break;
                } catch (CommitFailedException | RebalanceInProgressException | RetriableException e) {
                    Lines.line("commitfail", Lines.elapsedMillis(), Lines.describe(e));
                }
            }
        } catch (KafkaException e) {
            Lines.line("error", Lines.elapsedMillis(), Lines.describe(e));
            code = 1;
        } finally {
            running = null;
        }
        Lines.line("stopped", Lines.elapsedMillis(), handedOut);
        return code;
    }

    /**
     * On an empty poll, commits the positions that moved past records it never handed out
     * (on a virtual range topic, the other shares' records; also transaction markers), so
     * the group's committed offsets reach the log end as with auto-commit. Positions are
     * read without blocking: a partition whose position is unknown is left out.
     */
    private static void commitIdlePositions(KafkaConsumer<String, String> consumer) {
        Map<TopicPartition, OffsetAndMetadata> moved = new HashMap<>();
        for (TopicPartition tp : consumer.assignment()) {
            long position;
            try {
                position = consumer.position(tp, Duration.ZERO);
            } catch (org.apache.kafka.common.errors.TimeoutException e) {
                continue;
            }
            Long last = idleCommitted.get(tp);
            if (last == null || last != position) {
                moved.put(tp, new OffsetAndMetadata(position));
            }
        }
        if (moved.isEmpty()) {
            return;
        }
        try {
            consumer.commitSync(moved);
            moved.forEach((tp, offset) -> idleCommitted.put(tp, offset.offset()));
            List<String> commits = new ArrayList<>(moved.size());
            moved.forEach((tp, offset) -> commits.add(Lines.join("commit", Lines.escape(tp.topic()),
                    tp.partition(), offset.offset())));
            Lines.lines(commits);
        } catch (CommitFailedException | RebalanceInProgressException | RetriableException e) {
            Lines.line("commitfail", Lines.elapsedMillis(), Lines.describe(e));
        }
    }

    private static final Map<TopicPartition, Long> idleCommitted = new HashMap<>();

    private static String describe(Collection<TopicPartition> partitions) {
        List<String> names = new ArrayList<>(partitions.size());
        for (TopicPartition tp : partitions) {
            names.add(tp.topic() + ":" + tp.partition());
        }
        names.sort(null);
        return Lines.escape(String.join(",", names));
    }

    private static final class Listener implements ConsumerRebalanceListener {
        @Override
        public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
            Lines.line("assigned", Lines.elapsedMillis(), describe(partitions));
        }

        @Override
        public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
            Lines.line("revoked", Lines.elapsedMillis(), describe(partitions));
        }

        @Override
        public void onPartitionsLost(Collection<TopicPartition> partitions) {
            Lines.line("lost", Lines.elapsedMillis(), describe(partitions));
        }
    }
}
