package io.shmq.spark;

import io.shmq.spark.source.RecordSource;

import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadMaxRows;
import org.apache.spark.sql.connector.read.streaming.ReadMinRows;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

/**
 * spark.readStream.format("shmq") in the JVM: reader.py's StreamReader, option for option. An offset is
 * {"partition": next offset to read}, written exactly as the Python source writes it, so a checkpoint of one
 * restarts on the other; planning is a pure function of a batch's two offsets. The driver keeps one
 * {@link RecordSource}, opened at first use.
 */
final class ShmqMicroBatchStream extends SourceBase implements MicroBatchStream, SupportsTriggerAvailableNow {
    private final SourceOptions.OffsetSpec starting;
    private final Long maxRows, minRows;
    private final double maxDelay;
    private RecordSource source;
    private Map<Integer, Long> targetEnds;  // availableNow: the ends when the run began
    private Long lastBatch;  // System.nanoTime() of the last new offset (minRecordsPerTrigger)

    ShmqMicroBatchStream(SourceOptions opts) {
        super(opts, SourceOptions.STREAM_SOURCE);
        starting = opts.offsets("startingOffsets", "latest");
        maxRows = opts.integer("maxRecordsPerTrigger", null, 1);
        minRows = opts.integer("minRecordsPerTrigger", null, 1);
        if (minRows != null && maxRows != null && minRows > maxRows) {
            throw new ShmqSpecException("option " + opts.givenAs("minRecordsPerTrigger") + " (" + minRows
                    + ") is more than " + opts.givenAs("maxRecordsPerTrigger") + " (" + maxRows + ")");
        }
        maxDelay = opts.duration("maxTriggerDelay", "15m");
    }

    /**
     * {partition: {earliest, end}} over the kept source; one that failed is opened again, once (over url its
     * TcpStream has tried again already, for as long as option maxOutage says: it is not opened again).
     */
    private Map<Integer, long[]> now() {
        for (int attempt = 0; ; attempt++) {
            try {
                if (source == null) {
                    source = target.open("the driver");
                }
                return positions(source);
            } catch (IOException | UncheckedIOException e) {
                stop();
                if (attempt > 0 || target.url != null) {
                    throw e instanceof UncheckedIOException ? (UncheckedIOException) e
                            : new UncheckedIOException((IOException) e);
                }
            }
        }
    }

    @Override
    public Offset initialOffset() {
        return new JsonOffset(Plan.toJson(resolve(starting, now(), "startingOffsets", -2)));
    }

    @Override
    public Offset deserializeOffset(String json) {
        return new JsonOffset(json);
    }

    @Override
    public ReadLimit getDefaultReadLimit() {
        if (minRows != null) {
            return ReadLimit.minRows(minRows, (long) (maxDelay * 1000));
        }
        return maxRows != null ? ReadLimit.maxRows(maxRows) : ReadLimit.allAvailable();
    }

    @Override
    public void prepareForTriggerAvailableNow() {
        targetEnds = new TreeMap<>();
        now().forEach((p, ends) -> targetEnds.put(p, ends[1]));
    }

    @Override
    public Offset latestOffset() {
        throw new UnsupportedOperationException("the shmq source plans with latestOffset(start, limit)");
    }

    /**
     * The ends now (capped at availableNow's target), within {@code limit}: ReadMaxRows (and maxRecordsPerTrigger
     * with ReadMinRows) shared over the partitions; with ReadMinRows, {@code start} itself while fewer rows wait
     * and maxTriggerDelay has not passed since the last batch. A partition {@code start} lacks starts at 0.
     */
    @Override
    public Offset latestOffset(Offset startOffset, ReadLimit limit) {
        Map<Integer, Long> start = Plan.fromJson(startOffset.json());
        Map<Integer, Long> begin = new TreeMap<>(), backlog = new TreeMap<>();
        long waiting = 0;
        for (Map.Entry<Integer, long[]> e : now().entrySet()) {
            int p = e.getKey();
            long s = start.getOrDefault(p, 0L), earliest = e.getValue()[0], end = e.getValue()[1];
            if (end < s) {
                throw new IllegalStateException("stream " + SourceOptions.repr(target.stream) + " partition " + p
                        + " ends at " + end + ", before the query's offset " + s + ": was it deleted and created "
                        + "again? Start the query with a new checkpoint");
            }
            if (targetEnds != null) {
                end = Math.max(s, Math.min(end, targetEnds.getOrDefault(p, s)));
            }
            begin.put(p, Math.max(s, Math.min(earliest, end)));  // lost offsets count for nothing
            backlog.put(p, end - begin.get(p));
            waiting += end - begin.get(p);
        }
        long t = System.nanoTime();
        if (lastBatch == null) {
            lastBatch = t;
        }
        Long budget = null;
        if (limit instanceof ReadMaxRows) {
            budget = ((ReadMaxRows) limit).maxRows();
        } else if (limit instanceof ReadMinRows) {
            if (targetEnds == null && waiting < ((ReadMinRows) limit).minRows() && (t - lastBatch) / 1e9 < maxDelay) {
                return startOffset;
            }
            budget = maxRows;
        }
        Map<Integer, Long> take = budget == null ? backlog : Plan.share(backlog, budget);
        Map<Integer, Long> end = new TreeMap<>();
        begin.forEach((p, b) -> end.put(p, b + take.get(p)));
        if (!end.equals(start)) {
            lastBatch = t;
        }
        return new JsonOffset(Plan.toJson(end));
    }

    @Override
    public Offset reportLatestOffset() {
        Map<Integer, Long> ends = new TreeMap<>();
        now().forEach((p, e) -> ends.put(p, e[1]));
        return new JsonOffset(Plan.toJson(ends));
    }

    /** One range per partition with offsets in [start, end): from the two offsets alone. */
    @Override
    public InputPartition[] planInputPartitions(Offset startOffset, Offset endOffset) {
        Map<Integer, Long> start = Plan.fromJson(startOffset.json());
        List<Plan.Range> ranges = new ArrayList<>();
        Plan.fromJson(endOffset.json()).forEach((p, e) -> {
            long s = start.getOrDefault(p, 0L);
            if (e > s) {
                ranges.add(new Plan.Range(p, s, e));
            }
        });
        if (!ranges.isEmpty() && target.failOnDataLoss) {
            checkLoss(ranges, now());
        }
        return plan(ranges);
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
        return readerFactory();
    }

    @Override
    public void commit(Offset end) {
        // the checkpoint is the only record of progress
    }

    @Override
    public void stop() {
        RecordSource s = source;
        source = null;
        if (s != null) {
            try {
                s.close();
            } catch (IOException e) {
                // closing a read-only mapping or a socket: nothing to undo
            }
        }
    }

    /** An offset as its JSON text, compared by that text (as Spark compares offsets). */
    static final class JsonOffset extends Offset {
        private final String json;

        JsonOffset(String json) {
            this.json = json;
        }

        @Override
        public String json() {
            return json;
        }
    }
}
