package io.shmq.spark;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.vectorized.ColumnarBatch;

/** Makes each task's reader: columnar batches only, straight from the records (no row objects). */
final class ShmqReaderFactory implements PartitionReaderFactory {
    private static final long serialVersionUID = 1L;
    private final Target target;

    ShmqReaderFactory(Target target) {
        this.target = target;
    }

    @Override
    public boolean supportColumnarReads(InputPartition partition) {
        return true;
    }

    @Override
    public PartitionReader<ColumnarBatch> createColumnarReader(InputPartition partition) {
        return new ColumnarReader(target, (ShmqInputPartition) partition);
    }

    @Override
    public PartitionReader<InternalRow> createReader(InputPartition partition) {
        throw new UnsupportedOperationException("the shmq source reads columnar batches only");
    }
}
