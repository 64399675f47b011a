package io.keyrange.bench.streams;

import java.util.Arrays;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Set;

/**
 * The command line of the programs in this module: {@code --name value} pairs, each name
 * one of those the program knows, plus {@code --config key=value} (repeatable) for any Kafka
 * client or Streams setting, applied last so it overrides the defaults.
 */
final class Options {
    private final Map<String, String> values = new HashMap<>();
    private final Map<String, String> configs = new LinkedHashMap<>();

    Options(String[] args, String... known) {
        Set<String> names = new HashSet<>(Arrays.asList(known));
        for (int i = 0; i < args.length; i += 2) {
            if (!args[i].startsWith("--") || i + 1 >= args.length) {
                throw new IllegalArgumentException("expected --name value pairs, got: " + String.join(" ", args));
            }
            String name = args[i].substring(2);
            String value = args[i + 1];
            if (name.equals("config")) {
                int eq = value.indexOf('=');
                if (eq <= 0) {
                    throw new IllegalArgumentException("--config wants key=value, got " + value);
                }
                configs.put(value.substring(0, eq), value.substring(eq + 1));
            } else if (names.contains(name)) {
                values.put(name, value);
            } else {
                throw new IllegalArgumentException("unknown option --" + name + "; known: --"
                        + String.join(", --", known) + ", --config");
            }
        }
    }

    String required(String name) {
        String value = values.get(name);
        if (value == null) {
            throw new IllegalArgumentException("missing --" + name);
        }
        return value;
    }

    String get(String name, String otherwise) {
        return values.getOrDefault(name, otherwise);
    }

    boolean has(String name) {
        return values.containsKey(name);
    }

    long getLong(String name, long otherwise) {
        String value = values.get(name);
        return value == null ? otherwise : Long.parseLong(value);
    }

    double getDouble(String name, double otherwise) {
        String value = values.get(name);
        return value == null ? otherwise : Double.parseDouble(value);
    }

    /** The {@code --config} settings, in the order given. */
    Map<String, String> configs() {
        return configs;
    }
}
