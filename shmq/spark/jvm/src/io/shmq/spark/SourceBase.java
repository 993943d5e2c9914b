package io.shmq.spark;

import io.shmq.spark.source.RecordSource;

import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * What the streaming and the batch source share on the driver (reader.py's _Source): the options, the checks of
 * the offsets asked for, the check for lost offsets and the plan of one batch's Spark partitions.
 */
abstract class SourceBase {
    final SourceOptions opts;
    final Target target;
    final Long minPartitions, maxPartitions;

    SourceBase(SourceOptions opts, String part) {
        opts.refuseUnknown(part);
        this.opts = opts;
        this.target = new Target(opts);
        minPartitions = opts.integer("minPartitions", null, 1);
        // one wave of tasks by default, as the Python source plans (so both plan a replayed batch alike)
        Long dflt = opts.url != null || minPartitions != null ? null
                : Long.valueOf(Runtime.getRuntime().availableProcessors());
        Long max = opts.integer("maxPartitions", dflt, 1);
        maxPartitions = max != null && minPartitions != null ? Long.valueOf(Math.max(max, minPartitions)) : max;
        opts.integer("queueStageMaxBytes", null, 4096);
    }

    /** {partition: {earliest retained, end}} now. */
    Map<Integer, long[]> positions(RecordSource source) {
        try {
            Map<Integer, long[]> out = new TreeMap<>();
            int n = source.partitions();
            for (int p = 0; p < n; p++) {
                out.put(p, new long[]{source.earliest(p), source.latest(p)});
            }
            return out;
        } catch (IOException e) {
            throw new UncheckedIOException("shmq source: reading the offsets of stream "
                    + SourceOptions.repr(target.stream) + " in " + target.where() + " failed: " + e.getMessage(), e);
        }
    }

    /** startingOffsets / endingOffsets resolved against {@code positions}; {@code missing} for partitions left out. */
    Map<Integer, Long> resolve(SourceOptions.OffsetSpec spec, Map<Integer, long[]> positions, String name,
                               long missing) {
        Map<Integer, Long> out = new TreeMap<>();
        if (spec.word != null) {
            positions.forEach((p, ends) -> out.put(p, ends[spec.word.equals("latest") ? 1 : 0]));
            return out;
        }
        Map<Integer, Long> given;
        if (spec.byStream.containsKey(null)) {
            given = spec.byStream.get(null);
        } else {
            List<String> other = new ArrayList<>();
            for (String s : new TreeMap<>(spec.byStream).keySet()) {
                if (!s.equals(target.stream)) {
                    other.add(s);
                }
            }
            if (!other.isEmpty()) {
                throw new ShmqSpecException("option " + name + " names stream " + SourceOptions.repr(other.get(0))
                        + ", but this query reads stream " + SourceOptions.repr(target.stream)
                        + " (one stream: its offsets are all it takes)");
            }
            given = spec.byStream.get(target.stream);
        }
        for (int p : new TreeMap<>(given).keySet()) {
            if (!positions.containsKey(p)) {
                throw new ShmqSpecException("option " + name + " names partition " + p + ", but stream "
                        + SourceOptions.repr(target.stream) + " has partitions 0.." + (positions.size() - 1));
            }
        }
        positions.forEach((p, ends) -> {
            long o = given.getOrDefault(p, missing);
            long at = o == -2 ? ends[0] : o == -1 ? ends[1] : o;
            if (at > ends[1]) {
                throw new ShmqSpecException("option " + name + ": offset " + o + " of partition " + p
                        + " is past the end of stream " + SourceOptions.repr(target.stream) + " (" + ends[1] + ")");
            }
            out.put(p, at);
        });
        return out;
    }

    String loss(int p, long from, long to) {
        return "stream " + SourceOptions.repr(target.stream) + " partition " + p + ": offsets " + from + ".."
                + (to - 1) + " were dropped by retention (or lost) before the query read them";
    }

    /** With failOnDataLoss, fails on the first range that starts below what its partition retains. */
    void checkLoss(List<Plan.Range> ranges, Map<Integer, long[]> positions) {
        if (!target.failOnDataLoss) {
            return;
        }
        for (Plan.Range r : ranges) {
            long earliest = positions.containsKey(r.partition) ? positions.get(r.partition)[0] : r.start;
            if (r.start < earliest) {
                throw new DataLossError(loss(r.partition, r.start, Math.min(earliest, r.end))
                        + "; set failOnDataLoss=false to skip them");
            }
        }
    }

    /** The Spark partitions of {@code ranges}: cut by minPartitions, grouped by maxPartitions. */
    InputPartition[] plan(List<Plan.Range> ranges) {
        List<List<Plan.Range>> groups = Plan.group(Plan.split(ranges, minPartitions), maxPartitions);
        InputPartition[] out = new InputPartition[groups.size()];
        for (int i = 0; i < out.length; i++) {
            out[i] = new ShmqInputPartition(groups.get(i));
        }
        return out;
    }

    PartitionReaderFactory readerFactory() {
        return new ShmqReaderFactory(target);
    }

    /** Offsets a query planned to read were dropped before it read them, and failOnDataLoss is true. */
    static final class DataLossError extends IllegalStateException {
        private static final long serialVersionUID = 1L;

        DataLossError(String message) {
            super(message);
        }
    }
}
