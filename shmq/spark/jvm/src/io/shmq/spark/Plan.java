package io.shmq.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import java.io.IOException;
import java.io.Serializable;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * Planning, the JVM twin of reader.py's: offsets as JSON, read limits shared over partitions ({@link #share}),
 * ranges cut ({@link #split}) and grouped ({@link #group}) into Spark partitions. Everything here is a pure
 * function of its arguments, so a replayed batch plans the same on either source.
 */
public final class Plan {
    private static final ObjectMapper JSON = new ObjectMapper();

    private Plan() {
    }

    /** Offsets [start, end) of one stream partition. */
    public static final class Range implements Serializable {
        private static final long serialVersionUID = 1L;
        public final int partition;
        public final long start, end;

        public Range(int partition, long start, long end) {
            this.partition = partition;
            this.start = start;
            this.end = end;
        }

        long size() {
            return end - start;
        }

        @Override
        public boolean equals(Object o) {
            return o instanceof Range && ((Range) o).partition == partition && ((Range) o).start == start
                    && ((Range) o).end == end;
        }

        @Override
        public int hashCode() {
            return Long.hashCode(start * 31 + end) * 31 + partition;
        }

        @Override
        public String toString() {
            return partition + ":[" + start + "," + end + ")";
        }
    }

    /** {partition: offset} as the Python source writes it (json.dumps of a dict): {"0": 5, "1": 6}. */
    public static String toJson(Map<Integer, Long> offsets) {
        StringBuilder sb = new StringBuilder("{");
        for (Map.Entry<Integer, Long> e : offsets.entrySet()) {
            if (sb.length() > 1) {
                sb.append(", ");
            }
            sb.append('"').append(e.getKey()).append("\": ").append(e.getValue());
        }
        return sb.append('}').toString();
    }

    /** The offsets written by either source, in partition order. */
    public static Map<Integer, Long> fromJson(String json) {
        Map<Integer, Long> out = new TreeMap<>();
        try {
            JsonNode root = JSON.readTree(json);
            for (Map.Entry<String, JsonNode> e : root.properties()) {
                out.put(Integer.parseInt(e.getKey()), e.getValue().asLong());
            }
        } catch (IOException e) {
            throw new UncheckedIOException("shmq source: offsets that are not JSON: " + json, e);
        }
        return out;
    }

    /**
     * How many of each partition's backlog to take within {@code budget}: all if they fit; else in proportion,
     * every waiting partition at least one while the budget allows (largest backlogs first), the rest by largest
     * remainder, ties to the lower partition (reader.py's share).
     */
    public static Map<Integer, Long> share(Map<Integer, Long> backlog, long budget) {
        List<Integer> waiting = new ArrayList<>();
        long total = 0;
        for (Map.Entry<Integer, Long> e : backlog.entrySet()) {
            if (e.getValue() > 0) {
                waiting.add(e.getKey());
                total += e.getValue();
            }
        }
        if (total <= budget) {
            return new TreeMap<>(backlog);
        }
        waiting.sort(Comparator.<Integer>comparingLong(p -> -backlog.get(p)).thenComparingInt(p -> p));
        Map<Integer, Long> take = new TreeMap<>();
        for (Integer p : backlog.keySet()) {
            take.put(p, 0L);
        }
        for (int i = 0; i < Math.min(budget, waiting.size()); i++) {
            take.put(waiting.get(i), 1L);
        }
        long rest = budget - waiting.size();
        if (rest > 0) {
            long weights = 0;
            for (int p : waiting) {
                weights += backlog.get(p) - 1;
            }
            Map<Integer, Long> remainders = new TreeMap<>();
            long given = 0;
            for (int p : waiting) {
                long w = backlog.get(p) - 1;
                take.put(p, take.get(p) + Math.multiplyExact(rest, w) / weights);
                remainders.put(p, Math.multiplyExact(rest, w) % weights);
            }
            for (long t : take.values()) {
                given += t;
            }
            List<Integer> byRemainder = new ArrayList<>(waiting);
            byRemainder.sort(Comparator.<Integer>comparingLong(p -> -remainders.get(p)).thenComparingInt(p -> p));
            for (int i = 0; i < budget - given; i++) {
                int p = byRemainder.get(i);
                take.put(p, take.get(p) + 1);
            }
        }
        return take;
    }

    /** {@code ranges} cut into at least {@code minPartitions} pieces (when fewer), in proportion to their sizes. */
    public static List<Range> split(List<Range> ranges, Long minPartitions) {
        if (minPartitions == null || ranges.size() >= minPartitions) {
            return ranges;
        }
        long total = 0;
        for (Range r : ranges) {
            total += r.size();
        }
        List<Range> out = new ArrayList<>();
        for (Range r : ranges) {
            long size = r.size();
            long pieces = Math.min(size, -Math.floorDiv(-size * minPartitions, total));  // ceiling
            for (long i = 0; i < pieces; i++) {
                out.add(new Range(r.partition, r.start + size * i / pieces, r.start + size * (i + 1) / pieces));
            }
        }
        return out;
    }

    /**
     * {@code ranges} as at most {@code maxPartitions} Spark partitions (when more): about equal offsets in each,
     * the largest range first into the lightest, each group's ranges in partition order. Each element of the
     * result is one Spark partition's ranges.
     */
    public static List<List<Range>> group(List<Range> ranges, Long maxPartitions) {
        List<List<Range>> out = new ArrayList<>();
        if (maxPartitions == null || ranges.size() <= maxPartitions) {
            for (Range r : ranges) {
                out.add(List.of(r));
            }
            return out;
        }
        int n = (int) (long) maxPartitions;
        long[] weight = new long[n];
        List<List<Range>> bins = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            bins.add(new ArrayList<>());
        }
        List<Range> bySize = new ArrayList<>(ranges);
        bySize.sort(Comparator.<Range>comparingLong(r -> -r.size()).thenComparingInt(r -> r.partition)
                .thenComparingLong(r -> r.start));
        for (Range r : bySize) {
            int lightest = 0;
            for (int i = 1; i < n; i++) {  // Python's min() of [weight, index, ranges]: ties to the lower index
                if (weight[i] < weight[lightest]) {
                    lightest = i;
                }
            }
            weight[lightest] += r.size();
            bins.get(lightest).add(r);
        }
        for (List<Range> b : bins) {
            if (!b.isEmpty()) {
                b.sort(Comparator.<Range>comparingInt(r -> r.partition).thenComparingLong(r -> r.start));
                out.add(b);
            }
        }
        return out;
    }
}
