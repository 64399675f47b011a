package io.keyrange.bench;

import io.confluent.parallelconsumer.ParallelConsumerOptions;
import io.confluent.parallelconsumer.ParallelStreamProcessor;
import java.util.List;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.serialization.StringDeserializer;

/**
 * Confluent Parallel Consumer with KEY ordering and {@code maxConcurrency = --workers}, doing
 * the paced work of {@link Bench} per record, committing periodically (asynchronously) as
 * its default does.
 *
 * Usage: {@code ParallelBench --bootstrap H:P --topic T --group G --workers N [--work-ms 1]
 * [--warmup 3 --window 8 | --records R] [--timeout 120]}.
 */
public final class ParallelBench {
    public static void main(String[] args) throws Exception {
        Bench bench = new Bench(args, "bootstrap", "topic", "group", "workers");
        int workers = bench.intOption("workers", 1);
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bench.option("bootstrap"));
        props.put(ConsumerConfig.GROUP_ID_CONFIG, bench.option("group"));
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
        KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props);
        ParallelConsumerOptions<String, String> options = ParallelConsumerOptions.<String, String>builder()
            .ordering(ParallelConsumerOptions.ProcessingOrder.KEY)
            .maxConcurrency(workers)
            .consumer(consumer)
            .commitMode(ParallelConsumerOptions.CommitMode.PERIODIC_CONSUMER_ASYNCHRONOUS)
            .build();
        ParallelStreamProcessor<String, String> processor = ParallelStreamProcessor.createEosStreamProcessor(options);
        processor.subscribe(List.of(bench.option("topic")));
        processor.poll(context -> bench.process(context.getSingleConsumerRecord().value()));
        bench.measure("parallel_consumer", workers);
        Bench.exit();
    }
}
