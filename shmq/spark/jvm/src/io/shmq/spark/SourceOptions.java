package io.shmq.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.TreeMap;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The options of the "shmq" source, read once and checked before a task starts: the JVM twin of
 * shmq/spark/options.py (and the option checks of reader.py), with the same names, defaults and messages, so a
 * query behaves the same on either source. Spark lower-cases option names; every name is looked up lower-cased.
 */
public final class SourceOptions {
    public static final String STREAM_SOURCE = "the shmq streaming source";
    public static final String BATCH_SOURCE = "the shmq batch source";
    public static final String SINK = "the shmq sink";
    private static final String[] CONNECTION = {"stream", "queue", "namespace", "url", "token", "maxOutage"};
    private static final String[] SOURCE = concat(CONNECTION, "subscribe", "subscribePattern", "startingOffsets",
            "failOnDataLoss", "includeHeaders", "minPartitions", "maxPartitions", "queueStageMaxBytes");
    /** The options each part reads, in the order the messages list them (options.py's OPTIONS). */
    public static final Map<String, String[]> OPTIONS = new LinkedHashMap<>();

    static {
        OPTIONS.put(STREAM_SOURCE, concat(SOURCE, "maxRecordsPerTrigger", "maxOffsetsPerTrigger",
                "minRecordsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay"));
        OPTIONS.put(BATCH_SOURCE, concat(SOURCE, "endingOffsets"));
        OPTIONS.put(SINK, concat(CONNECTION, "sinkStagingMaxBytes", "checkpointLocation", "queryName"));
    }

    private static final String[][] KAFKA_NAMES = {{"maxRecordsPerTrigger", "maxOffsetsPerTrigger"},
            {"minRecordsPerTrigger", "minOffsetsPerTrigger"}};
    private static final String[][] RENAMED = {
            {"stageMaxBytes", "queueStageMaxBytes", "the size of the stream that stages a queue source"},
            {"stagingMaxBytes", "sinkStagingMaxBytes", "the size of each partition of the sink's staging stream"}};
    private static final String[] TARGETS = {"stream", "queue", "subscribe", "subscribePattern"};
    private static final Pattern DURATION = Pattern.compile("\\s*(\\d+(?:\\.\\d+)?)\\s*([a-z]*)\\s*");
    private static final ObjectMapper JSON = new ObjectMapper();

    private final Map<String, String> raw = new TreeMap<>();
    /** The stream named (stream or subscribe); null for a queue or subscribePattern. */
    public final String stream;
    public final String queue, pattern, url, token, namespaceOption;

    public SourceOptions(Map<String, String> given) {
        for (Map.Entry<String, String> e : given.entrySet()) {
            raw.put(e.getKey().toLowerCase(Locale.ROOT), e.getValue());
        }
        for (String[] r : RENAMED) {
            if (raw.containsKey(lower(r[0]))) {
                throw new ShmqSpecException("option " + r[0] + " is now " + r[1] + " (" + r[2] + ")");
            }
        }
        for (String[] k : KAFKA_NAMES) {
            if (raw.containsKey(lower(k[0])) && raw.containsKey(lower(k[1]))) {
                throw new ShmqSpecException("give option " + k[0] + " or Kafka's name for it, " + k[1] + ", not both");
            }
        }
        List<String> targets = new ArrayList<>();
        for (String t : TARGETS) {
            if (get(t) != null) {
                targets.add(t);
            }
        }
        if (targets.size() != 1) {
            throw new ShmqSpecException("the shmq data source needs exactly one of .option('stream', NAME) or "
                    + ".option('queue', NAME) (a source also takes Kafka's subscribe or subscribePattern)"
                    + (targets.isEmpty() ? "" : ", not " + String.join(" and ", targets)));
        }
        String named = get("stream");
        String subscribe = get("subscribe");
        if (subscribe != null) {
            List<String> names = new ArrayList<>();
            for (String n : subscribe.split(",")) {
                if (!n.strip().isEmpty()) {
                    names.add(n.strip());
                }
            }
            if (names.size() != 1) {
                throw new ShmqSpecException("option subscribe must name one stream, not " + repr(subscribe)
                        + ": a shmq source reads one stream (start a query per stream, or union their DataFrames)");
            }
            named = names.get(0);
        }
        stream = named;
        queue = get("queue");
        pattern = get("subscribePattern");
        if (pattern != null) {
            try {
                Pattern.compile(pattern);
            } catch (RuntimeException e) {
                throw new ShmqSpecException("option subscribePattern is not a regular expression: " + repr(pattern));
            }
        }
        url = get("url");
        token = get("token");
        namespaceOption = get("namespace");
        if (url != null && namespaceOption != null) {
            throw new ShmqSpecException("give .option('namespace', ...) for a local broker or .option('url', ...) "
                    + "for a remote one, not both");
        }
        if (url != null && !(url.startsWith("tcp://") || url.startsWith("tcps://"))) {
            throw new ShmqSpecException("option url must be tcp://host:port (tcps:// for TLS), not " + repr(url));
        }
        if (get("maxOutage") != null) {
            maxOutage();  // (a bad value refused now)
        }
    }

    /**
     * Option maxOutage in seconds: seconds (300) or a duration with its unit (500ms, 90s, 5m); by default
     * options.py's (the Python clients' max_outage), from the jar (io.shmq.spark.tcp.Reconnect).
     */
    public double maxOutage() {
        String v = get("maxOutage");
        if (v == null) {
            return io.shmq.spark.tcp.Reconnect.defaultMaxOutage();
        }
        Matcher m = DURATION.matcher(v.toLowerCase(Locale.ROOT));
        double unit = m.matches() ? unitSeconds(m.group(2).isEmpty() ? "s" : m.group(2)) : -1;
        if (unit < 0) {
            throw new ShmqSpecException("option maxOutage must be seconds (300) or a duration like 500ms, 90s "
                    + "or 5m, not " + repr(v));
        }
        return Double.parseDouble(m.group(1)) * unit;
    }

    /** The namespace a local read attaches to: the option, else $SHMQ_NAMESPACE, else "shmq" (as the Python source). */
    public String namespace() {
        if (namespaceOption != null) {
            return namespaceOption;
        }
        String env = System.getenv("SHMQ_NAMESPACE");
        return env == null || env.isEmpty() ? "shmq" : env;
    }

    /** Why this source must run in Python (the queue source, subscribePattern), or null when the JVM reads it. */
    public String pythonOnly() {
        if (queue != null) {
            return "option queue: a queue source moves the queue's messages into a stream through Python";
        }
        if (pattern != null) {
            return "option subscribePattern: the streams it matches are listed through Python";
        }
        return null;
    }

    /** Option {@code name} as given, or under Kafka's name for it; null when not given. */
    public String get(String name) {
        String v = raw.get(lower(name));
        if (v == null) {
            for (String[] k : KAFKA_NAMES) {
                if (k[0].equals(name)) {
                    v = raw.get(lower(k[1]));
                }
            }
        }
        return v;
    }

    /** The name option {@code name} was given under (ours, or Kafka's), for messages. */
    public String givenAs(String name) {
        for (String[] k : KAFKA_NAMES) {
            if (k[0].equals(name) && !raw.containsKey(lower(name)) && raw.containsKey(lower(k[1]))) {
                return k[1];
            }
        }
        return name;
    }

    public Long integer(String name, Long dflt, long minimum) {
        String v = get(name);
        if (v == null) {
            return dflt;
        }
        long value;
        try {
            value = Long.parseLong(v.strip());
        } catch (NumberFormatException e) {
            throw new ShmqSpecException("option " + givenAs(name) + " must be an integer, not " + repr(v));
        }
        if (value < minimum) {
            throw new ShmqSpecException("option " + givenAs(name) + " must be >= " + minimum + ", not " + value);
        }
        return value;
    }

    public boolean flag(String name, boolean dflt) {
        String v = get(name);
        if (v == null) {
            return dflt;
        }
        String l = v.toLowerCase(Locale.ROOT);
        if (l.equals("true") || l.equals("1") || l.equals("yes")) {
            return true;
        }
        if (l.equals("false") || l.equals("0") || l.equals("no")) {
            return false;
        }
        throw new ShmqSpecException("option " + name + " must be true or false, not " + repr(v));
    }

    /** Option {@code name} in seconds: a number and a unit (us, ms, s, m or min, h, d), a bare number being ms. */
    public double duration(String name, String dflt) {
        String v = get(name);
        v = v == null ? dflt : v;
        Matcher m = DURATION.matcher(v.toLowerCase(Locale.ROOT));
        double unit = m.matches() ? unitSeconds(m.group(2).isEmpty() ? "ms" : m.group(2)) : -1;
        if (unit < 0) {
            throw new ShmqSpecException("option " + name + " must be a duration like 500ms, 15s or 15m, not "
                    + repr(v));
        }
        return Double.parseDouble(m.group(1)) * unit;
    }

    private static double unitSeconds(String unit) {
        switch (unit) {
            case "us": return 1e-6;
            case "ms": return 1e-3;
            case "s": return 1.0;
            case "m": case "min": return 60.0;
            case "h": return 3600.0;
            case "d": return 86400.0;
            default: return -1;
        }
    }

    /**
     * {@code earliest} / {@code latest} or JSON offsets per partition (-2 earliest, -1 latest), as Kafka's source
     * reads them: {"STREAM": {"0": 23}} or {"0": 23}.
     */
    public OffsetSpec offsets(String name, String dflt) {
        String v = get(name);
        v = v == null ? dflt : v;
        if (v.equals("earliest") || v.equals("latest")) {
            return new OffsetSpec(v, null);
        }
        Map<String, Map<Integer, Long>> byStream = new LinkedHashMap<>();
        try {
            JsonNode root = JSON.readTree(v);
            if (root == null || !root.isObject()) {
                throw new IllegalArgumentException();
            }
            boolean nested = root.size() > 0;
            for (JsonNode n : root) {
                nested &= n.isObject();
            }
            if (nested) {
                for (Map.Entry<String, JsonNode> e : root.properties()) {
                    byStream.put(e.getKey(), partitions(e.getValue()));
                }
            } else {
                byStream.put(null, partitions(root));
            }
        } catch (Exception e) {
            throw new ShmqSpecException("option " + name + " must be earliest, latest or JSON like {\"STREAM\": "
                    + "{\"0\": 23, \"1\": -2}} or {\"0\": 23, \"1\": -2}, not " + repr(v));
        }
        for (Map<Integer, Long> parts : byStream.values()) {
            for (long o : parts.values()) {
                if (o < -2) {
                    throw new ShmqSpecException("option " + name + ": an offset is >= 0, or -2 (earliest) or -1 "
                            + "(latest): " + repr(v));
                }
            }
        }
        return new OffsetSpec(null, byStream);
    }

    private static Map<Integer, Long> partitions(JsonNode node) {
        Map<Integer, Long> out = new LinkedHashMap<>();
        for (Map.Entry<String, JsonNode> e : node.properties()) {
            JsonNode o = e.getValue();
            if (!(o.isIntegralNumber() || o.isTextual())) {
                throw new IllegalArgumentException();
            }
            long offset = o.isTextual() ? Long.parseLong(o.asText().strip()) : o.asLong();
            out.put(Integer.parseInt(e.getKey().strip()), offset);
        }
        return out;
    }

    /** Refuses an option given that {@code part} does not read, naming the part that does or the closest name. */
    public void refuseUnknown(String part) {
        String[] known = OPTIONS.get(part);
        Map<String, String> byLower = new LinkedHashMap<>();
        for (String k : known) {
            byLower.put(lower(k), k);
        }
        List<String> hints = new ArrayList<>();
        for (String u : raw.keySet()) {
            if (byLower.containsKey(u)) {
                continue;
            }
            List<String> parts = new ArrayList<>();
            for (Map.Entry<String, String[]> e : OPTIONS.entrySet()) {
                for (String n : e.getValue()) {
                    if (lower(n).equals(u)) {
                        parts.add(e.getKey());
                    }
                }
            }
            String close = Similar.closest(u, byLower.keySet());
            hints.add(!parts.isEmpty() ? u + " (an option of " + String.join(" and ", parts) + ")"
                    : close != null ? u + " (did you mean " + byLower.get(close) + "?)" : u);
        }
        if (!hints.isEmpty()) {
            throw new ShmqSpecException(part + " has no option" + (hints.size() > 1 ? "s " : " ")
                    + String.join(", ", hints) + "; its options are " + String.join(", ", known));
        }
    }

    /** {@code s} as Python's repr() writes a str (the messages are the Python source's). */
    static String repr(String s) {
        return s.indexOf('\'') >= 0 && s.indexOf('"') < 0 ? "\"" + s + "\"" : "'" + s.replace("'", "\\'") + "'";
    }

    private static String lower(String s) {
        return s.toLowerCase(Locale.ROOT);
    }

    private static String[] concat(String[] a, String... b) {
        String[] out = new String[a.length + b.length];
        System.arraycopy(a, 0, out, 0, a.length);
        System.arraycopy(b, 0, out, a.length, b.length);
        return out;
    }

    /** A parsed startingOffsets / endingOffsets: a word (earliest, latest) or {stream or null: {partition: offset}}. */
    public static final class OffsetSpec {
        public final String word;
        public final Map<String, Map<Integer, Long>> byStream;

        OffsetSpec(String word, Map<String, Map<Integer, Long>> byStream) {
            this.word = word;
            this.byStream = byStream;
        }

        /** Whether any partition is given as {@code offset} (-1, -2). */
        public boolean has(long offset) {
            if (byStream == null) {
                return false;
            }
            for (Map<Integer, Long> parts : byStream.values()) {
                if (parts.containsValue(offset)) {
                    return true;
                }
            }
            return false;
        }
    }
}
