package io.keyrange.bench.streams;

import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.LongAdder;
import java.util.concurrent.locks.LockSupport;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.common.config.TopicConfig;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.CloseOptions;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;
import org.apache.kafka.streams.state.KeyValueBytesStoreSupplier;
import org.apache.kafka.streams.state.Stores;

/**
 * A Kafka Streams application that counts the records of each key, exactly once: it reads
 * {@code --input} (a plain topic, or a virtual range topic such as {@code orders.kr4} that
 * the proxy presents as an ordinary topic), counts per key in a key-value store
 * ({@code groupByKey().count()}), and writes every new count to {@code --output} as
 * (key, count in decimal), with {@code processing.guarantee=exactly_once_v2}.
 *
 * <p>What makes an exact check possible: the input is already keyed, so {@code groupByKey}
 * needs no repartition topic (the records of a key stay in their partition, and the count
 * of a key lives in the task of that partition); the store's changelog topic and the output
 * are written in the same transaction as the input offsets, so after any number of kills
 * the last count of each key in {@code --output}, read with
 * {@code isolation.level=read_committed} once every transaction has ended, equals the number
 * of input records of that key. Records with a null key or a null value are not counted
 * ({@code KGroupedStream.count} skips them).
 *
 * <p>Usage: {@code KeyCountApp --bootstrap H:P --input T --output O --application-id A
 * --state-dir DIR [--threads 1] [--commit-interval-ms 100] [--delay-us 0]
 * [--delay-mode sleep|spin] [--replication-factor 1] [--min-insync-replicas N]
 * [--output-partitions N] [--store rocksdb|memory] [--guarantee exactly_once_v2|at_least_once]
 * [--instance-id ID] [--on-error replace|shutdown] [--progress-ms 1000]
 * [--close-timeout-ms 30000] [--leave-on-close true] [--topic-wait-ms 30000] [--config key=value]...}
 *
 * <ul>
 *   <li>{@code --delay-us}: per-record processing time, to make the application
 *       processing-bound; {@code sleep} (the default) parks the stream thread until the
 *       record's deadline, one delay after the previous record's (so the timer's overshoot
 *       is made up, and time spent waiting for records is not), {@code spin} burns the
 *       CPU for it.</li>
 *   <li>{@code --replication-factor} and {@code --min-insync-replicas} (default 2 from 3
 *       replicas, else 1) apply to the topics the application creates: its changelog and,
 *       when it does not exist yet, {@code --output} (with {@code --output-partitions},
 *       default the input's partition count; 0 leaves the output to be created by
 *       others).</li>
 *   <li>{@code --instance-id}: static membership ({@code group.instance.id}); a restarted
 *       instance with the same id takes its partitions back without a rebalance.</li>
 *   <li>{@code --on-error}: what a stream thread's uncaught exception does: {@code replace}
 *       (the default) starts a new thread, {@code shutdown} stops the instance.</li>
 * </ul>
 *
 * <p>Lines on stdout (tab-separated; {@code ms} is milliseconds since the JVM started):
 * <pre>
 * start    ms  application.id  pid
 * state    ms  NEW_STATE  OLD_STATE          every state change (RUNNING, REBALANCING, ...)
 * progress ms  processed  STATE              every --progress-ms
 * error    ms  thread  Class: message        a stream thread died (escaped, see Lines)
 * stopped  ms  processed  closed             closed is true if close finished in time
 * </pre>
 * {@code processed} counts the records this process handed to the counting step, including
 * those it processes again after a crash of its own or of another instance. On SIGTERM or
 * SIGINT the application closes (committing what it processed, and leaving the group so the
 * other instances take its tasks over at once, unless {@code --leave-on-close false}) within
 * {@code --close-timeout-ms} and exits with 0, or 1 if the close did not finish; it exits
 * with 1 when it reaches the ERROR or NOT_RUNNING state by itself, and with 2 on a bad
 * command line. Logs (slf4j-simple, WARN) go to stderr.
 */
public final class KeyCountApp {
    private static final String STORE = "counts";

    private KeyCountApp() {
    }

    public static void main(String[] args) throws Exception {
        Signals.quietLogs();
        Options options;
        try {
            options = new Options(args, "bootstrap", "input", "output", "application-id", "state-dir", "threads",
                    "commit-interval-ms", "delay-us", "delay-mode", "replication-factor", "min-insync-replicas",
                    "output-partitions", "store", "guarantee", "instance-id", "on-error", "progress-ms",
                    "close-timeout-ms", "leave-on-close", "topic-wait-ms");
            options.required("bootstrap");
            options.required("input");
            options.required("output");
            options.required("application-id");
            options.required("state-dir");
        } catch (IllegalArgumentException e) {
            System.err.println("KeyCountApp: " + e.getMessage());
            System.exit(2);
            return;
        }
        System.exit(run(options));
    }

    static int run(Options options) throws Exception {
        String input = options.required("input");
        String output = options.required("output");
        String applicationId = options.required("application-id");
        int replication = (int) options.getLong("replication-factor", 1);
        int minInsync = (int) options.getLong("min-insync-replicas", replication >= 3 ? 2 : 1);
        boolean replace = switch (options.get("on-error", "replace")) {
            case "replace" -> true;
            case "shutdown" -> false;
            default -> throw new IllegalArgumentException("--on-error is replace or shutdown");
        };

        Properties props = new Properties();
        props.put(StreamsConfig.APPLICATION_ID_CONFIG, applicationId);
        props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, options.required("bootstrap"));
        props.put(StreamsConfig.STATE_DIR_CONFIG, options.required("state-dir"));
        props.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, options.get("threads", "1"));
        props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, options.get("commit-interval-ms", "100"));
        props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, options.get("guarantee", StreamsConfig.EXACTLY_ONCE_V2));
        props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, replication);
        props.put(StreamsConfig.topicPrefix(TopicConfig.MIN_IN_SYNC_REPLICAS_CONFIG), Integer.toString(minInsync));
        props.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.StringSerde.class.getName());
        props.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.StringSerde.class.getName());
        // the handler's default from Kafka 5.0 on; without it every start warns about it
        props.put("processing.exception.handler.global.enabled", "true");
        if (options.has("instance-id")) {
            props.put(StreamsConfig.consumerPrefix("group.instance.id"), options.get("instance-id", ""));
        }
        props.putAll(options.configs());

        prepareTopics(options, input, output, replication, minInsync);
        Lines.line("start", Lines.elapsedMillis(), applicationId, ProcessHandle.current().pid());

        LongAdder processed = new LongAdder();
        Pacer pacer = new Pacer(options.getLong("delay-us", 0) * 1_000,
                options.get("delay-mode", "sleep").equals("spin"));
        KafkaStreams streams = new KafkaStreams(topology(input, output, options.get("store", "rocksdb"), pacer,
                processed), props);
        CountDownLatch stop = new CountDownLatch(1);
        streams.setStateListener((now, before) -> {
            Lines.line("state", Lines.elapsedMillis(), now, before);
            if (!now.isRunningOrRebalancing()) {
                stop.countDown(); // ERROR or a shutdown: nothing more will be processed
            }
        });
        streams.setUncaughtExceptionHandler(error -> {
            Lines.line("error", Lines.elapsedMillis(), Lines.escape(Thread.currentThread().getName()),
                    Lines.describe(error));
            return replace ? StreamThreadExceptionResponse.REPLACE_THREAD
                    : StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
        });
        Signals.onStop(stop::countDown);
        streams.start();
        long progressMs = Math.max(10, options.getLong("progress-ms", 1000));
        while (!stop.await(progressMs, TimeUnit.MILLISECONDS)) {
            Lines.line("progress", Lines.elapsedMillis(), processed.sum(), streams.state());
        }
        boolean failed = !streams.state().isRunningOrRebalancing() && streams.state() != KafkaStreams.State.CREATED;
        boolean leave = Boolean.parseBoolean(options.get("leave-on-close", "true"));
        boolean closed = streams.close(CloseOptions.timeout(Duration.ofMillis(options.getLong("close-timeout-ms", 30_000)))
                .withGroupMembershipOperation(leave ? CloseOptions.GroupMembershipOperation.LEAVE_GROUP
                        : CloseOptions.GroupMembershipOperation.REMAIN_IN_GROUP));
        Lines.line("stopped", Lines.elapsedMillis(), processed.sum(), closed);
        return closed && !failed ? 0 : 1;
    }

    /** Counts per key of {@code input}, written to {@code output} as decimal strings. */
    static Topology topology(String input, String output, String store, Pacer pacer, LongAdder processed) {
        KeyValueBytesStoreSupplier supplier = switch (store) {
            case "rocksdb" -> Stores.persistentKeyValueStore(STORE);
            case "memory" -> Stores.inMemoryKeyValueStore(STORE);
            default -> throw new IllegalArgumentException("--store is rocksdb or memory");
        };
        StreamsBuilder builder = new StreamsBuilder();
        builder.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
                .peek((key, value) -> {
                    pacer.pace();
                    processed.increment();
                })
                // the key is unchanged since the source: no repartition topic
                .groupByKey()
                .count(Materialized.<String, Long>as(supplier).withKeySerde(Serdes.String())
                        .withValueSerde(Serdes.Long()))
                .toStream()
                .mapValues(count -> Long.toString(count))
                .to(output, Produced.with(Serdes.String(), Serdes.String()));
        return builder.build();
    }

    /**
     * Waits (up to {@code --topic-wait-ms}) for the input topic to exist, and creates the
     * output topic if it is missing; returns the input's partition count.
     */
    static int prepareTopics(Options options, String input, String output, int replication, int minInsync)
            throws InterruptedException, ExecutionException {
        Map<String, Object> config = new HashMap<>();
        for (Map.Entry<String, String> entry : options.configs().entrySet()) {
            if (AdminClientConfig.configNames().contains(entry.getKey())) {
                config.put(entry.getKey(), entry.getValue());
            }
        }
        config.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, options.required("bootstrap"));
        try (Admin admin = Admin.create(config)) {
            long deadline = System.nanoTime() + options.getLong("topic-wait-ms", 30_000) * 1_000_000;
            int partitions;
            while (true) {
                try {
                    partitions = admin.describeTopics(List.of(input)).allTopicNames().get(30, TimeUnit.SECONDS)
                            .get(input).partitions().size();
                    break;
                } catch (ExecutionException e) {
                    if (!(e.getCause() instanceof UnknownTopicOrPartitionException) || System.nanoTime() > deadline) {
                        throw e;
                    }
                } catch (java.util.concurrent.TimeoutException e) {
                    if (System.nanoTime() > deadline) {
                        throw new IllegalStateException("the input topic " + input + " could not be described", e);
                    }
                }
                Thread.sleep(200); // back-off between attempts to describe the input topic
            }
            int outputPartitions = (int) options.getLong("output-partitions", partitions);
            if (outputPartitions > 0) {
                NewTopic topic = new NewTopic(output, outputPartitions, (short) replication)
                        .configs(Map.of(TopicConfig.MIN_IN_SYNC_REPLICAS_CONFIG, Integer.toString(minInsync)));
                try {
                    admin.createTopics(List.of(topic)).all().get(30, TimeUnit.SECONDS);
                } catch (ExecutionException e) {
                    if (!(e.getCause() instanceof TopicExistsException)) {
                        throw e;
                    }
                } catch (java.util.concurrent.TimeoutException e) {
                    throw new IllegalStateException("the output topic " + output + " could not be created", e);
                }
            }
            return partitions;
        }
    }

    /**
     * Paced work per record: each call on a thread returns one delay after the previous
     * call's deadline (so the timer's overshoot is made up), restarting from now when the
     * thread was idle for more than two delays (waiting for records is never made up).
     */
    static final class Pacer {
        private final long nanos;
        private final boolean spin;
        private final ThreadLocal<long[]> due = ThreadLocal.withInitial(() -> new long[] {System.nanoTime()});

        Pacer(long nanos, boolean spin) {
            this.nanos = nanos;
            this.spin = spin;
        }

        void pace() {
            if (nanos <= 0) {
                return;
            }
            long[] deadline = due.get();
            long now = System.nanoTime();
            long next = (now - deadline[0] > 2 * nanos ? now : deadline[0]) + nanos;
            deadline[0] = next;
            long left;
            while ((left = next - System.nanoTime()) > 0) {
                if (spin) {
                    Thread.onSpinWait();
                } else {
                    LockSupport.parkNanos(left);
                }
            }
        }
    }
}
