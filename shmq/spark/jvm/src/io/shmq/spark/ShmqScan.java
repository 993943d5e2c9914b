package io.shmq.spark;

import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.types.StructType;

/** A read of a stream: a batch ({@link ShmqBatch}) or micro-batches ({@link ShmqMicroBatchStream}). */
final class ShmqScan implements ScanBuilder, Scan {
    private final SourceOptions opts;

    ShmqScan(SourceOptions opts) {
        this.opts = opts;
    }

    @Override
    public Scan build() {
        return this;
    }

    @Override
    public StructType readSchema() {
        return Schema.of(opts.flag("includeHeaders", false));
    }

    @Override
    public String description() {
        return "shmq stream " + SourceOptions.repr(opts.stream);
    }

    @Override
    public Batch toBatch() {
        return new ShmqBatch(opts);
    }

    @Override
    public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
        return new ShmqMicroBatchStream(opts);
    }
}
