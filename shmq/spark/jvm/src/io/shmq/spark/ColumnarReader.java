package io.shmq.spark;

import io.shmq.spark.shm.OnDiskException;
import io.shmq.spark.source.DataLossException;
import io.shmq.spark.source.Headers;
import io.shmq.spark.source.RecordBlock;
import io.shmq.spark.source.RecordSource;

import org.apache.spark.TaskContext;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.execution.vectorized.ConstantColumnVector;
import org.apache.spark.sql.execution.vectorized.OnHeapColumnVector;
import org.apache.spark.sql.execution.vectorized.WritableColumnVector;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;
import org.apache.spark.unsafe.types.UTF8String;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ArrayBlockingQueue;

/**
 * One task's reader: the ranges of its Spark partition, range after range, as columnar batches of at most
 * {@link #READ_CHUNK} records, each batch's columns ({@link Schema}'s) the {@link RecordBlock} it was read into
 * ({@link BlockColumn}: no copy into vectors). Offsets dropped by retention while it reads fail the task or are
 * skipped with a warning, as failOnDataLoss says. The block goes back to a small spare pool at close, so the next
 * task of this executor does not grow an arena anew.
 */
final class ColumnarReader implements PartitionReader<ColumnarBatch> {
    static final int READ_CHUNK = 10_000;  // records per batch, as the Python source reads
    private static final Logger LOG = LoggerFactory.getLogger("shmq.spark");
    /** Blocks of finished readers, for the next tasks of this executor (no arena grown anew for each task). */
    private static final ArrayBlockingQueue<RecordBlock> SPARE =
            new ArrayBlockingQueue<>(Runtime.getRuntime().availableProcessors());
    /** A block whose arena grew past this (large records) is not kept for another task. */
    static final int SPARE_MAX_BYTES = 8 << 20;

    private final Target target;
    private final Plan.Range[] ranges;
    private final RecordBlock block;
    private final WritableColumnVector headers;
    private final ConstantColumnVector stream, partition;
    private final ColumnarBatch batch;
    private RecordSource source;
    private int range;
    private long next = -1;
    private boolean closed;

    ColumnarReader(Target target, ShmqInputPartition part) {
        this.target = target;
        this.ranges = part.ranges;
        RecordBlock spare = SPARE.poll();
        block = spare != null ? spare : new RecordBlock();
        StructType schema = Schema.of(target.includeHeaders);
        stream = new ConstantColumnVector(READ_CHUNK, DataTypes.StringType);
        stream.setUtf8String(UTF8String.fromString(target.stream));
        partition = new ConstantColumnVector(READ_CHUNK, DataTypes.IntegerType);
        headers = target.includeHeaders ? new OnHeapColumnVector(READ_CHUNK, schema.fields()[6].dataType()) : null;
        ColumnVector[] columns = {BlockColumn.key(block), BlockColumn.value(block), stream, partition,
                BlockColumn.offset(block), BlockColumn.timestamp(block), headers};
        if (headers == null) {
            columns = Arrays.copyOf(columns, 6);
        }
        batch = new ColumnarBatch(columns);
    }

    @Override
    public boolean next() throws IOException {
        while (range < ranges.length) {
            Plan.Range r = ranges[range];
            if (next < r.start) {
                next = r.start;
            }
            if (next >= r.end) {
                range++;
                next = -1;
                continue;
            }
            if (source == null) {
                TaskContext task = TaskContext.get();
                source = target.open("partition " + (task == null ? "?" : task.partitionId()));
            }
            int got;
            try {
                got = source.read(r.partition, next, r.end, (int) Math.min(READ_CHUNK, r.end - next), block);
            } catch (DataLossException e) {
                next = skip(r, e);
                continue;
            } catch (OnDiskException e) {
                throw new IllegalStateException("stream " + SourceOptions.repr(target.stream) + " partition "
                        + r.partition + ": offsets " + next + ".." + (e.memoryEarliest() - 1) + " are only in the "
                        + "stream's logs on disk, which the JVM source does not read: read them with "
                        + "format('shmq_python')", e);
            }
            if (got == 0 && block.next <= next) {
                throw new IllegalStateException("stream " + SourceOptions.repr(target.stream) + " partition "
                        + r.partition + " ends before offset " + next + ": was it deleted and created again?");
            }
            next = block.next; // (past a transaction's marker and an aborted one's records too)
            if (got == 0) {
                continue;
            }
            fill(r.partition, got);
            return true;
        }
        return false;
    }

    /** Where to read on after offsets below the partition's earliest: fails with failOnDataLoss, else warns. */
    private long skip(Plan.Range r, DataLossException e) {
        long resume = Math.min(e.firstAvailable(), r.end);
        if (resume <= next) {
            throw new IllegalStateException("stream " + SourceOptions.repr(target.stream) + " partition "
                    + r.partition + ": " + e.getMessage(), e);
        }
        String message = "stream " + SourceOptions.repr(target.stream) + " partition " + r.partition + ": offsets "
                + next + ".." + (resume - 1) + " were dropped by retention (or lost) before the query read them";
        if (target.failOnDataLoss) {
            throw new SourceBase.DataLossError(message + "; set failOnDataLoss=false to skip them");
        }
        LOG.warn("{}: skipped (failOnDataLoss=false)", message);
        return resume;
    }

    /** The batch is the block's records: only the partition, and the headers when asked for, are filled in. */
    private void fill(int p, int n) {
        partition.setInt(p);
        if (headers != null) {
            fillHeaders(n);
        }
        batch.setNumRows(n);
    }

    private void fillHeaders(int n) {
        headers.reset();
        WritableColumnVector keys = headers.getChild(0);
        WritableColumnVector values = headers.getChild(1);
        int at = 0;
        for (int i = 0; i < n; i++) {
            List<Map.Entry<String, String>> pairs = Headers.decode(block.data, block.headersStart[i],
                    block.headersLen[i]);
            keys.reserve(at + pairs.size());
            values.reserve(at + pairs.size());
            headers.putArray(i, at, pairs.size());
            for (Map.Entry<String, String> e : pairs) {
                keys.putByteArray(at, e.getKey().getBytes(StandardCharsets.UTF_8));
                if (e.getValue() == null) { // a null header value
                    values.putNull(at);
                } else {
                    values.putByteArray(at, e.getValue().getBytes(StandardCharsets.UTF_8));
                }
                at++;
            }
        }
    }

    /** Blocks kept for the next readers (tests). */
    static int spares() {
        return SPARE.size();
    }

    @Override
    public ColumnarBatch get() {
        return batch;
    }

    @Override
    public void close() throws IOException {
        if (closed) {
            return;
        }
        closed = true;
        batch.close();
        if (block.data.length <= SPARE_MAX_BYTES) {
            block.clear();
            SPARE.offer(block);  // dropped when enough are kept
        }
        if (source != null) {
            source.close();
        }
    }
}
