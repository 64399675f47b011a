package io.keyrange.bench;

import java.util.HashMap;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.LongAdder;
import java.util.concurrent.locks.LockSupport;

/**
 * What every key-ordered harness shares, so the peers are measured the same way as the
 * Python side (benchmarks/workloads/key_ordered.py):
 *
 * <ul>
 *   <li>values start with {@code "<key number>:<sequence>:"}, the sequence counting the
 *       records of that key from 0, so a consumer can tell when a key's records are
 *       processed out of order;</li>
 *   <li>the work per record is paced, not computed: each worker's calls end one work time
 *       after the previous call's deadline (not after its actual wake-up, so the timer's
 *       overshoot does not count as work), restarting from now when the worker was idle
 *       for more than two work times (waiting for records is never made up);</li>
 *   <li>the rate is counted over a window that starts a warm-up after the first record was
 *       processed, or, with {@code --records}, until that many records were processed.</li>
 * </ul>
 *
 * The result is one JSON line on stdout.
 */
public final class Bench {
    private final Map<String, String> options;
    private final long workNanos;
    private final LongAdder processed = new LongAdder();
    private final LongAdder violations = new LongAdder();
    private final LongAdder redeliveries = new LongAdder();
    private final ConcurrentHashMap<String, Long> lastSequence = new ConcurrentHashMap<>();
    private final ThreadLocal<long[]> due = ThreadLocal.withInitial(() -> new long[] {System.nanoTime()});
    private volatile boolean stopping;

    public Bench(String[] args, String... required) {
        options = new HashMap<>();
        for (int i = 0; i < args.length; i++) {
            if (!args[i].startsWith("--") || i + 1 >= args.length) {
                throw new IllegalArgumentException("expected --name value pairs, got " + String.join(" ", args));
            }
            options.put(args[i].substring(2), args[++i]);
        }
        for (String name : required) {
            if (!options.containsKey(name)) {
                throw new IllegalArgumentException("missing --" + name);
            }
        }
        workNanos = (long) (Double.parseDouble(option("work-ms", "1")) * 1_000_000);
    }

    public String option(String name) {
        return options.get(name);
    }

    public String option(String name, String otherwise) {
        return options.getOrDefault(name, otherwise);
    }

    public int intOption(String name, int otherwise) {
        return Integer.parseInt(option(name, Integer.toString(otherwise)));
    }

    public boolean stopping() {
        return stopping;
    }

    /** One record's work and order check, on the worker's own thread. */
    public void process(String value) {
        if (workNanos > 0) {
            long[] next = due.get();
            long now = System.nanoTime();
            if (now - next[0] > 2 * workNanos) {
                next[0] = now;
            }
            next[0] += workNanos;
            long left;
            while ((left = next[0] - System.nanoTime()) > 0) {
                LockSupport.parkNanos(left);
            }
        }
        int first = value.indexOf(':');
        int second = value.indexOf(':', first + 1);
        if (first > 0 && second > first) {
            String key = value.substring(0, first);
            long sequence = Long.parseLong(value.substring(first + 1, second));
            Long previous = lastSequence.put(key, sequence);
            if (previous != null && sequence <= previous) {
                if (sequence == previous) {
                    redeliveries.increment();
                } else {
                    violations.increment();
                }
            }
        }
        processed.increment();
    }

    /**
     * Wait for the measurement to end and print its JSON line. With {@code --records} the run
     * ends when that many records were processed; otherwise after {@code --warmup} and
     * {@code --window} seconds counted from the first processed record.
     */
    public void measure(String peer, int workers) throws InterruptedException {
        double timeout = Double.parseDouble(option("timeout", "120"));
        long deadline = System.nanoTime() + (long) (timeout * 1e9);
        long target = Long.parseLong(option("records", "0"));
        long began = System.nanoTime();
        while (processed.sum() == 0) {
            waitOrFail(deadline, "no record processed");
        }
        long firstAt = System.nanoTime();
        long counted;
        double seconds;
        if (target > 0) {
            while (processed.sum() < target) {
                waitOrFail(deadline, processed.sum() + " of " + target + " records processed");
            }
            counted = processed.sum();
            seconds = (System.nanoTime() - began) / 1e9;
        } else {
            TimeUnit.MILLISECONDS.sleep((long) (Double.parseDouble(option("warmup", "3")) * 1000));
            long before = processed.sum();
            long start = System.nanoTime();
            TimeUnit.MILLISECONDS.sleep((long) (Double.parseDouble(option("window", "8")) * 1000));
            counted = processed.sum() - before;
            seconds = (System.nanoTime() - start) / 1e9;
        }
        stopping = true;
        System.out.printf(
            "{\"peer\": \"%s\", \"workers\": %d, \"records\": %d, \"seconds\": %.3f, \"records_per_s\": %.1f, "
                + "\"processed_total\": %d, \"order_violations\": %d, \"redeliveries\": %d, \"keys_seen\": %d, "
                + "\"first_record_after_s\": %.3f}%n",
            peer, workers, counted, seconds, counted / seconds, processed.sum(), violations.sum(),
            redeliveries.sum(), lastSequence.size(), (firstAt - began) / 1e9);
        System.out.flush();
    }

    private static void waitOrFail(long deadline, String what) throws InterruptedException {
        if (System.nanoTime() > deadline) {
            System.err.println("timed out: " + what);
            System.err.flush();
            Runtime.getRuntime().halt(3);
        }
        TimeUnit.MILLISECONDS.sleep(20);
    }

    /** Leave at once: closing consumers politely can take seconds the runs do not need. */
    public static void exit() {
        System.out.flush();
        Runtime.getRuntime().halt(0);
    }
}
