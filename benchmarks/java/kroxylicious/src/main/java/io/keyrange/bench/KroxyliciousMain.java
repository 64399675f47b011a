package io.keyrange.bench;

import io.kroxylicious.proxy.KafkaProxy;
import io.kroxylicious.proxy.config.ConfigParser;
import io.kroxylicious.proxy.config.Configuration;
import io.kroxylicious.proxy.internal.config.Features;
import java.nio.file.Files;
import java.nio.file.Path;

/**
 * Kroxylicious from kroxylicious-runtime: Maven Central does not carry kroxylicious-app,
 * whose main class reads a configuration file and starts the proxy; this does the same with
 * the runtime's own parser and {@code KafkaProxy}, nothing else.
 *
 * Usage: {@code KroxyliciousMain CONFIG.yaml}. Prints {@code READY} once listening.
 */
public final class KroxyliciousMain {
    public static void main(String[] args) throws Exception {
        ConfigParser parser = new ConfigParser();
        Configuration configuration = parser.parseConfiguration(Files.readString(Path.of(args[0])));
        try (KafkaProxy proxy = new KafkaProxy(parser, configuration, Features.defaultFeatures())) {
            proxy.startup();
            System.out.println("READY");
            System.out.flush();
            proxy.block();
        }
    }
}
