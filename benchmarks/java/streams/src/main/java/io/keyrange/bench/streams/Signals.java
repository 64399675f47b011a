package io.keyrange.bench.streams;

import sun.misc.Signal;

/**
 * SIGTERM and SIGINT run {@code onStop} instead of starting the JVM's shutdown, so the
 * program closes its clients itself and exits with its own code (0 when the close finished
 * in time) rather than 143.
 */
final class Signals {
    private Signals() {
    }

    static void onStop(Runnable onStop) {
        for (String name : new String[] {"TERM", "INT"}) {
            Signal.handle(new Signal(name), signal -> onStop.run());
        }
    }

    /** slf4j-simple at WARN on stderr, unless the command line set it otherwise. */
    static void quietLogs() {
        System.setProperty("org.slf4j.simpleLogger.defaultLogLevel",
                System.getProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn"));
        System.setProperty("org.slf4j.simpleLogger.logFile",
                System.getProperty("org.slf4j.simpleLogger.logFile", "System.err"));
        System.setProperty("org.slf4j.simpleLogger.showDateTime",
                System.getProperty("org.slf4j.simpleLogger.showDateTime", "true"));
        System.setProperty("org.slf4j.simpleLogger.dateTimeFormat",
                System.getProperty("org.slf4j.simpleLogger.dateTimeFormat", "HH:mm:ss.SSS"));
    }
}
