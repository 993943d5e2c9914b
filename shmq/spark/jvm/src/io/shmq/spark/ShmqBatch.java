package io.shmq.spark;

import io.shmq.spark.source.RecordSource;

import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;

/** spark.read.format("shmq") in the JVM: the records from startingOffsets to endingOffsets, resolved when planned. */
final class ShmqBatch extends SourceBase implements Batch {
    private final SourceOptions.OffsetSpec starting, ending;

    ShmqBatch(SourceOptions opts) {
        super(opts, SourceOptions.BATCH_SOURCE);
        starting = opts.offsets("startingOffsets", "earliest");
        ending = opts.offsets("endingOffsets", "latest");
        if ("latest".equals(starting.word) || starting.has(-1)) {
            throw new ShmqSpecException("option startingOffsets cannot be latest (-1) in a batch query: it would "
                    + "read nothing");
        }
        if ("earliest".equals(ending.word) || ending.has(-2)) {
            throw new ShmqSpecException("option endingOffsets cannot be earliest (-2) in a batch query: it would "
                    + "read nothing");
        }
    }

    @Override
    public InputPartition[] planInputPartitions() {
        Map<Integer, long[]> positions;
        try (RecordSource source = target.open("the driver")) {
            positions = positions(source);
        } catch (IOException e) {
            throw new UncheckedIOException(e);
        }
        Map<Integer, Long> start = resolve(starting, positions, "startingOffsets", -2);
        Map<Integer, Long> end = resolve(ending, positions, "endingOffsets", -1);
        List<Plan.Range> ranges = new ArrayList<>();
        for (int p : positions.keySet()) {
            if (end.get(p) < start.get(p)) {
                throw new ShmqSpecException("partition " + p + ": endingOffsets (" + end.get(p) + ") is before "
                        + "startingOffsets (" + start.get(p) + ")");
            }
            if (end.get(p) > start.get(p)) {
                ranges.add(new Plan.Range(p, start.get(p), end.get(p)));
            }
        }
        checkLoss(ranges, positions);
        return plan(ranges);
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
        return readerFactory();
    }
}
