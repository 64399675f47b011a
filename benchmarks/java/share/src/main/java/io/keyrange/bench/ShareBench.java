package io.keyrange.bench;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.atomic.LongAdder;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.KafkaShareConsumer;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * {@code --workers} consumers on one topic, each on its own thread, each doing the paced
 * work of {@link Bench} per record:
 *
 * <ul>
 *   <li>{@code --mode share}: KafkaShareConsumers of one share group (KIP-932). Records
 *       are acknowledged implicitly on the next poll. The group's
 *       {@code share.auto.offset.reset} must be set to earliest beforehand.</li>
 *   <li>{@code --mode plain}: KafkaConsumers of one classic consumer group; on one
 *       partition only one of them gets records, which is the point of comparing.</li>
 * </ul>
 *
 * Usage: {@code ShareBench --bootstrap H:P --topic T --group G --workers N --mode share|plain
 * [--max-poll-records 500] [--acquire-mode record_limit|batch_optimized] [--work-ms 1] [--warmup 3 --window 8 | --records R] [--timeout 120]
 * [--progress-ms 0]}.
 *
 * <p>{@code --progress-ms M} (M &gt; 0): every M milliseconds a line {@code progress <System.nanoTime() / 1000>
 * <records processed>} on stdout (CLOCK_MONOTONIC on Linux, the clock of Python's {@code time.monotonic()}),
 * so a caller can take the rate over any part of the run (benchmarks/bench_coop.py).
 */
public final class ShareBench {
    public static void main(String[] args) throws Exception {
        Bench bench = new Bench(args, "bootstrap", "topic", "group", "workers");
        String mode = bench.option("mode", "share");
        int workers = bench.intOption("workers", 1);
        LongAdder handed = new LongAdder();
        List<Thread> threads = new ArrayList<>();
        for (int i = 0; i < workers; i++) {
            Properties props = new Properties();
            props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bench.option("bootstrap"));
            props.put(ConsumerConfig.GROUP_ID_CONFIG, bench.option("group"));
            props.put(ConsumerConfig.CLIENT_ID_CONFIG, bench.option("group") + "-" + i);
            props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
            props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
            props.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, bench.option("max-poll-records", "500"));
            Runnable loop;
            if (mode.equals("share")) {
                // record_limit: a poll returns at most max.poll.records, instead of whole producer
                // batches, so the members of the group can share the records of one partition
                props.put("share.acquire.mode", bench.option("acquire-mode", "record_limit"));
                loop = () -> {
                    try (KafkaShareConsumer<String, String> consumer = new KafkaShareConsumer<>(props)) {
                        consumer.subscribe(List.of(bench.option("topic")));
                        while (!bench.stopping()) {
                            for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(200))) {
                                bench.process(record.value());
                                handed.increment();
                            }
                        }
                    }
                };
            } else if (mode.equals("plain")) {
                props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
                loop = () -> {
                    try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props)) {
                        consumer.subscribe(List.of(bench.option("topic")));
                        while (!bench.stopping()) {
                            for (ConsumerRecord<String, String> record : consumer.poll(Duration.ofMillis(200))) {
                                bench.process(record.value());
                            }
                            consumer.commitAsync();
                        }
                    }
                };
            } else {
                throw new IllegalArgumentException("--mode must be share or plain, not " + mode);
            }
            Thread thread = new Thread(loop, "worker-" + i);
            thread.setDaemon(true);
            thread.start();
            threads.add(thread);
        }
        long progressMs = Long.parseLong(bench.option("progress-ms", "0"));
        if (progressMs > 0) {
            Thread reporter = new Thread(() -> {
                while (true) {
                    System.out.println("progress " + System.nanoTime() / 1000 + " " + handed.sum());
                    try {
                        Thread.sleep(progressMs);
                    } catch (InterruptedException e) {
                        return;
                    }
                }
            }, "progress");
            reporter.setDaemon(true);
            reporter.start();
        }
        bench.measure(mode.equals("share") ? "share_group" : "plain_group", workers);
        if (progressMs > 0) {
            System.out.println("progress " + System.nanoTime() / 1000 + " " + handed.sum());
        }
        Bench.exit();
    }
}
