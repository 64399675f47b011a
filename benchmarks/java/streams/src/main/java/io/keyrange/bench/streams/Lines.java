package io.keyrange.bench.streams;

import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.charset.StandardCharsets;
import java.util.List;

/**
 * Tab-separated lines on stdout, for the Python launcher (harness/streams_app.py) to
 * parse.  Each call is one unbuffered write(2) of whole lines, so a line is out of the
 * process when the call returns (a later SIGKILL cannot take it back) and a kill cannot cut
 * one in the middle, and lines of different threads never interleave.
 *
 * <p>Fields that carry data (keys, values, messages) go through {@link #escape}: a null is
 * {@code \N}, and backslash, tab, newline and carriage return become {@code \\}, {@code \t},
 * {@code \n} and {@code \r}.
 */
final class Lines {
    private static final FileOutputStream OUT = new FileOutputStream(FileDescriptor.out);
    private static final long STARTED = System.nanoTime();

    private Lines() {
    }

    /** Milliseconds since the program started (the JVM's monotonic clock). */
    static long elapsedMillis() {
        return (System.nanoTime() - STARTED) / 1_000_000;
    }

    static String join(Object... fields) {
        StringBuilder line = new StringBuilder();
        for (int i = 0; i < fields.length; i++) {
            if (i > 0) {
                line.append('\t');
            }
            line.append(fields[i]);
        }
        return line.toString();
    }

    /** Writes one line made of {@code fields}. */
    static void line(Object... fields) {
        write(join(fields) + "\n");
    }

    /** Writes {@code lines} with one system call. */
    static void lines(List<String> lines) {
        if (lines.isEmpty()) {
            return;
        }
        StringBuilder text = new StringBuilder();
        for (String line : lines) {
            text.append(line).append('\n');
        }
        write(text.toString());
    }

    private static synchronized void write(String text) {
        try {
            OUT.write(text.getBytes(StandardCharsets.UTF_8));
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
    }

    static String escape(String text) {
        if (text == null) {
            return "\\N";
        }
        StringBuilder out = null;
        for (int i = 0; i < text.length(); i++) {
            char c = text.charAt(i);
            String replacement = switch (c) {
                case '\\' -> "\\\\";
                case '\t' -> "\\t";
                case '\n' -> "\\n";
                case '\r' -> "\\r";
                default -> null;
            };
            if (replacement != null && out == null) {
                out = new StringBuilder(text.substring(0, i));
            }
            if (out != null) {
                if (replacement != null) {
                    out.append(replacement);
                } else {
                    out.append(c);
                }
            }
        }
        return out == null ? text : out.toString();
    }

    /** {@code Class: message} of a throwable, escaped for one field. */
    static String describe(Throwable error) {
        return escape(error.getClass().getName() + ": " + error.getMessage());
    }
}
