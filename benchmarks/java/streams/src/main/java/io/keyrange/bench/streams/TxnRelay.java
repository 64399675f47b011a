package io.keyrange.bench.streams;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.locks.LockSupport;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.AuthorizationException;
import org.apache.kafka.common.errors.OutOfOrderSequenceException;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.errors.RetriableException;
import org.apache.kafka.common.errors.TransactionAbortedException;
import org.apache.kafka.common.errors.UnsupportedVersionException;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * A consume-transform-produce loop with Kafka transactions: a KafkaConsumer of group
 * {@code --group} subscribed to {@code --input} (a plain topic, or a virtual range topic such
 * as {@code orders.kr4} that the proxy presents as an ordinary topic) with
 * {@code isolation.level=read_committed} and auto commit off, and a transactional
 * KafkaProducer ({@code --transactional-id}, one per instance). For each poll that returns
 * records: {@code beginTransaction}, one output record per input record to {@code --output},
 * {@code sendOffsetsToTransaction} of the offsets after the poll's records with the
 * consumer's {@code groupMetadata()} (KIP-447: the group coordinator refuses the offsets of a
 * member that is no longer in the generation), then {@code commitTransaction}. So every input
 * record is in the committed output exactly once, whatever aborts, rebalances and kills.
 *
 * <p>Every {@code --abort-every}-th transaction of a launch (default 5; 0: never) is aborted
 * on purpose after its records were sent and its offsets added: the consumer then seeks each
 * partition of the aborted poll back to the poll's first offset there, and the next
 * transaction does the same work again. A transaction that fails with an error the producer
 * can abort (a rebalance fenced the member's offsets, a timeout) is aborted and rewound the
 * same way; one that cannot be aborted, or a fatal producer error (fenced by a newer
 * instance with the same transactional id), ends the program with exit code 1.
 *
 * <p>An output record has the input record's key and the value
 * {@code <input topic>:<input partition>:<input offset> TAB <transactional id>/<pid>/<transaction>
 * TAB <input value>} (the input value escaped as {@link Lines#escape} does), so a checker
 * can tell which input record it came from and which transaction of which launch wrote it.
 *
 * <p>Usage: {@code TxnRelay --bootstrap H:P --input T --output O --group G
 * [--transactional-id ID] [--client-id C] [--abort-every 5] [--delay-ms 0] [--max-poll-records 100]
 * [--poll-ms 200] [--max-seconds 3600] [--close-timeout-ms 10000] [--config key=value]...}.
 * A {@code --config} key goes to the consumer, the producer or both, whichever knows it; the
 * prefixes {@code consumer.} and {@code producer.} send it to one only. Offsets reset to
 * the earliest. {@code --delay-ms} is each transaction's processing time, spent after its
 * records were sent and before its offsets are (so that a kill is likely to find a
 * transaction open). The default transactional id is {@code <group>-<pid>}; an instance started
 * again with the same id fences its previous launch (whose open transaction is aborted).
 *
 * <p>Lines on stdout (tab-separated; ranges listed as {@code topic:partition:first:last},
 * offsets inclusive, separated by commas; partitions as {@code topic:partition}):
 * <pre>
 * start     ms  transactional.id  pid
 * ready     ms                                    initTransactions done, subscribing
 * assigned  ms  partitions                        after a rebalance gave them
 * revoked   ms  partitions                        before they are taken away
 * lost      ms  partitions                        taken away without a chance to commit
 * begin     ms  txn  records                      a transaction began, for the records of one poll
 * commit    ms  txn  records  ranges              a transaction committed
 * abort     ms  txn  records  ranges  reason      aborted and rewound; reason: planned, or
 *                                                 Class: message of the error that aborted it
 * error     ms  Class: message                    a poll failed, or an output record was not sent
 * fatal     ms  Class: message                    the loop ends, exit code 1
 * stopped   ms  committed  records  aborted  records   transactions and their input records
 * </pre>
 * {@code txn} numbers the transactions of a launch from 1. A {@code commit} line is written
 * after {@code commitTransaction} returned (a kill can come between the two: the committed
 * output then has records no line reports). SIGTERM or SIGINT (or {@code --max-seconds})
 * ends the loop after the current transaction; consumer and producer close and the exit code
 * is 0 (1 after a fatal error, 2 on a bad command line).
 */
public final class TxnRelay {
    private static volatile boolean stopping;
    private static volatile KafkaConsumer<String, String> running;

    private final KafkaConsumer<String, String> consumer;
    private final KafkaProducer<String, String> producer;
    private final String output;
    private final String writer;
    private final long abortEvery;
    private final long delayMillis;
    /** The input records of the open transaction, by partition (empty when none is open). */
    private final Map<TopicPartition, long[]> open = new LinkedHashMap<>();
    private boolean inTransaction;
    private int openRecords;
    private long transactions;
    private long committed;
    private long committedRecords;
    private long aborted;
    private long abortedRecords;

    private TxnRelay(KafkaConsumer<String, String> consumer, KafkaProducer<String, String> producer, String output,
                     String transactionalId, long abortEvery, long delayMillis) {
        this.consumer = consumer;
        this.producer = producer;
        this.output = output;
        this.writer = transactionalId + "/" + ProcessHandle.current().pid() + "/";
        this.abortEvery = abortEvery;
        this.delayMillis = delayMillis;
    }

    public static void main(String[] args) {
        Signals.quietLogs();
        Options options;
        try {
            options = new Options(args, "bootstrap", "input", "output", "group", "transactional-id", "client-id",
                    "abort-every", "delay-ms", "max-poll-records", "poll-ms", "max-seconds", "close-timeout-ms");
            options.required("bootstrap");
            options.required("input");
            options.required("output");
            options.required("group");
            if (options.getLong("abort-every", 5) < 0) {
                throw new IllegalArgumentException("--abort-every is 0 (never) or more");
            }
        } catch (IllegalArgumentException e) {
            System.err.println("TxnRelay: " + e.getMessage());
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
        String group = options.required("group");
        String transactionalId = options.get("transactional-id", group + "-" + ProcessHandle.current().pid());
        String clientId = options.get("client-id", transactionalId);

        Properties consumerProps = new Properties();
        consumerProps.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, options.required("bootstrap"));
        consumerProps.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        consumerProps.put(ConsumerConfig.CLIENT_ID_CONFIG, clientId + "-consumer");
        consumerProps.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        consumerProps.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        consumerProps.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        consumerProps.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, options.get("max-poll-records", "100"));
        consumerProps.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        consumerProps.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());

        Properties producerProps = new Properties();
        producerProps.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, options.required("bootstrap"));
        producerProps.put(ProducerConfig.CLIENT_ID_CONFIG, clientId + "-producer");
        producerProps.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, transactionalId);
        producerProps.put(ProducerConfig.ACKS_CONFIG, "all");
        producerProps.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        producerProps.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        producerProps.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
        producerProps.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());

        for (Map.Entry<String, String> entry : options.configs().entrySet()) {
            String key = entry.getKey();
            if (key.startsWith("consumer.")) {
                consumerProps.put(key.substring("consumer.".length()), entry.getValue());
            } else if (key.startsWith("producer.")) {
                producerProps.put(key.substring("producer.".length()), entry.getValue());
            } else {
                boolean known = false;
                if (ConsumerConfig.configNames().contains(key)) {
                    consumerProps.put(key, entry.getValue());
                    known = true;
                }
                if (ProducerConfig.configNames().contains(key)) {
                    producerProps.put(key, entry.getValue());
                    known = true;
                }
                if (!known) {
                    System.err.println("TxnRelay: --config " + key + " is neither a consumer nor a producer setting");
                    return 2;
                }
            }
        }

        Lines.line("start", Lines.elapsedMillis(), Lines.escape(transactionalId), ProcessHandle.current().pid());
        Duration pollTimeout = Duration.ofMillis(options.getLong("poll-ms", 200));
        Duration closeTimeout = Duration.ofMillis(options.getLong("close-timeout-ms", 10_000));
        long deadline = System.nanoTime() + options.getLong("max-seconds", 3600) * 1_000_000_000L;
        int code = 0;
        TxnRelay relay = null;
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(producerProps);
             KafkaConsumer<String, String> consumer = new KafkaConsumer<>(consumerProps)) {
            try {
                relay = new TxnRelay(consumer, producer, options.required("output"), transactionalId,
                        options.getLong("abort-every", 5), options.getLong("delay-ms", 0));
                producer.initTransactions();
                Lines.line("ready", Lines.elapsedMillis());
                running = consumer;
                consumer.subscribe(List.of(options.required("input")), relay.new Listener());
                code = relay.loop(pollTimeout, deadline);
            } catch (KafkaException | IllegalStateException e) {
                Lines.line("fatal", Lines.elapsedMillis(), Lines.describe(e));
                code = 1;
            } finally {
                running = null;
                if (code != 0) {
                    // a producer that failed fatally cannot send its close requests: do not wait
                    producer.close(Duration.ZERO);
                } else {
                    producer.close(closeTimeout);
                }
                consumer.close(closeTimeout);
            }
        } catch (KafkaException e) {
            Lines.line("fatal", Lines.elapsedMillis(), Lines.describe(e));
            code = 1;
        }
        if (relay != null) {
            Lines.line("stopped", Lines.elapsedMillis(), relay.committed, relay.committedRecords, relay.aborted,
                    relay.abortedRecords);
        } else {
            Lines.line("stopped", Lines.elapsedMillis(), 0, 0, 0, 0);
        }
        return code;
    }

    /** Polls and relays until asked to stop; 0, or 1 after a fatal error. */
    private int loop(Duration pollTimeout, long deadline) {
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
                continue;
            }
            if (!relay(records)) {
                return 1;
            }
        }
        return 0;
    }

    /** One transaction for the records of one poll; false after a fatal error. */
    private boolean relay(ConsumerRecords<String, String> records) {
        transactions++;
        long txn = transactions;
        boolean planned = abortEvery > 0 && txn % abortEvery == 0;
        Map<TopicPartition, OffsetAndMetadata> next = new HashMap<>();
        open.clear();
        try {
            producer.beginTransaction();
            inTransaction = true;
            openRecords = records.count();
            Lines.line("begin", Lines.elapsedMillis(), txn, records.count());
            String prefix = writer + txn;
            for (ConsumerRecord<String, String> record : records) {
                TopicPartition tp = new TopicPartition(record.topic(), record.partition());
                long[] range = open.computeIfAbsent(tp, unused -> new long[] {record.offset(), record.offset()});
                range[1] = record.offset();
                next.put(tp, new OffsetAndMetadata(record.offset() + 1, record.leaderEpoch(), ""));
                String value = record.topic() + ":" + record.partition() + ":" + record.offset() + "\t" + prefix
                        + "\t" + Lines.escape(record.value());
                producer.send(new ProducerRecord<>(output, record.key(), value), (metadata, error) -> {
                    // records of an aborted transaction that were not sent yet fail so: expected
                    if (error != null && !(error instanceof TransactionAbortedException)) {
                        Lines.line("error", Lines.elapsedMillis(), Lines.describe(error));
                    }
                });
            }
            if (delayMillis > 0) {
                pause(delayMillis);
            }
            producer.sendOffsetsToTransaction(next, consumer.groupMetadata());
            if (planned) {
                return abort(txn, records.count(), "planned");
            }
            producer.commitTransaction();
            inTransaction = false;
            committed++;
            committedRecords += records.count();
            Lines.line("commit", Lines.elapsedMillis(), txn, records.count(), ranges());
            open.clear();
            return true;
        } catch (ProducerFencedException | OutOfOrderSequenceException | AuthorizationException
                 | UnsupportedVersionException e) {
            // the producer cannot go on: another launch took the transactional id, or the broker refuses
            inTransaction = false;
            Lines.line("fatal", Lines.elapsedMillis(), Lines.describe(e));
            return false;
        } catch (KafkaException e) {
            // abortable: the member was fenced by a rebalance (CommitFailedException), a timeout, ...
            return abort(txn, records.count(), Lines.describe(e));
        }
    }

    /** Aborts the open transaction and rewinds its partitions; false if the abort failed. */
    private boolean abort(long txn, int count, String reason) {
        try {
            producer.abortTransaction();
        } catch (KafkaException | IllegalStateException e) {
            // the transaction stays open until the broker times it out; so does this launch's work
            inTransaction = false;
            Lines.line("fatal", Lines.elapsedMillis(), Lines.escape("transaction " + txn + " could not be aborted ("
                    + reason + "): " + e.getClass().getName() + ": " + e.getMessage()));
            return false;
        }
        inTransaction = false;
        aborted++;
        abortedRecords += count;
        // the work is done again: each partition of the aborted poll from its first record
        // (the positions moved past them; the group's committed offsets did not)
        Collection<TopicPartition> assigned = consumer.assignment();
        for (Map.Entry<TopicPartition, long[]> entry : open.entrySet()) {
            if (assigned.contains(entry.getKey())) {
                consumer.seek(entry.getKey(), entry.getValue()[0]);
            }
        }
        Lines.line("abort", Lines.elapsedMillis(), txn, count, ranges(), reason);
        open.clear();
        return true;
    }

    /** The transaction's processing time: the thread parks (an interrupt is kept, not thrown). */
    private static void pause(long millis) {
        long until = System.nanoTime() + millis * 1_000_000;
        long left;
        while ((left = until - System.nanoTime()) > 0 && !Thread.currentThread().isInterrupted()) {
            LockSupport.parkNanos(left);
        }
    }

    private String ranges() {
        List<String> out = new ArrayList<>(open.size());
        for (Map.Entry<TopicPartition, long[]> entry : open.entrySet()) {
            out.add(entry.getKey().topic() + ":" + entry.getKey().partition() + ":" + entry.getValue()[0] + ":"
                    + entry.getValue()[1]);
        }
        return Lines.escape(String.join(",", out));
    }

    private static String describe(Collection<TopicPartition> partitions) {
        List<String> names = new ArrayList<>(partitions.size());
        for (TopicPartition tp : partitions) {
            names.add(tp.topic() + ":" + tp.partition());
        }
        names.sort(null);
        return Lines.escape(String.join(",", names));
    }

    /**
     * Rebalance callbacks run inside {@code poll} (and {@code close}), and every transaction
     * ends before the next poll, so none is open here; should one be, it is aborted before the
     * partitions go (its offsets would be refused by the group coordinator anyway, KIP-447).
     */
    private final class Listener implements ConsumerRebalanceListener {
        @Override
        public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
            Lines.line("assigned", Lines.elapsedMillis(), describe(partitions));
        }

        @Override
        public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
            abortOpen("revoked");
            Lines.line("revoked", Lines.elapsedMillis(), describe(partitions));
        }

        @Override
        public void onPartitionsLost(Collection<TopicPartition> partitions) {
            abortOpen("lost");
            Lines.line("lost", Lines.elapsedMillis(), describe(partitions));
        }

        private void abortOpen(String why) {
            if (!inTransaction) {
                return;
            }
            try {
                producer.abortTransaction();
                aborted++;
                abortedRecords += openRecords;
                Lines.line("abort", Lines.elapsedMillis(), transactions, openRecords, ranges(), "partitions " + why);
            } catch (KafkaException | IllegalStateException e) {
                Lines.line("error", Lines.elapsedMillis(), Lines.describe(e));
            }
            inTransaction = false;
            open.clear();
        }
    }
}
