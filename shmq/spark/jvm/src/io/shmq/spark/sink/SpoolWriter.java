package io.shmq.spark.sink;

import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.arrow.vector.ipc.ArrowFileWriter;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.write.DataWriter;
import org.apache.spark.sql.connector.write.DataWriterFactory;
import org.apache.spark.sql.connector.write.WriterCommitMessage;
import org.apache.spark.sql.connector.write.streaming.StreamingDataWriterFactory;
import org.apache.spark.sql.execution.arrow.ArrowWriter;
import org.apache.spark.sql.types.StructType;

import java.io.File;
import java.io.IOException;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.nio.file.attribute.PosixFilePermissions;

/**
 * A task of the JVM sink: its rows, as Spark hands them, written to a spool of its own in /dev/shm (an Arrow IPC
 * file, owner-only, Spark's own row-to-Arrow writer, its binary columns by {@link RowBinaryWriter}), a batch every
 * {@link #ROWS} rows or {@link #BYTES} bytes; its commit message names the spool ({@link Spool}); an abort deletes
 * it. No lock, no other process: the driver's commit hands the spools to the publisher.
 */
final class SpoolWriter implements DataWriter<InternalRow> {
    static final int ROWS = 16384;
    static final long BYTES = 8L << 20;

    private final String path;
    private final int task;
    private final long epoch;
    private final ArrowWriter arrow;
    private final VectorSchemaRoot root;
    private final FileChannel channel;
    private final ArrowFileWriter file;
    private long rows;
    private int pending;
    private boolean done;

    SpoolWriter(StructType schema, String timeZone, String path, int task, long epoch) throws IOException {
        this.path = path;
        this.task = task;
        this.epoch = epoch;
        arrow = RowBinaryWriter.create(schema, timeZone);
        root = arrow.root();
        FileChannel ch = null;
        try {
            ch = FileChannel.open(Path.of(path), java.util.Set.of(StandardOpenOption.CREATE_NEW,
                    StandardOpenOption.WRITE), PosixFilePermissions.asFileAttribute(
                    PosixFilePermissions.fromString("rw-------")));
            file = new ArrowFileWriter(root, null, ch);
            file.start();
        } catch (IOException | RuntimeException e) {
            if (ch != null) {
                ch.close();
            }
            root.close();
            new File(path).delete();
            throw e;
        }
        channel = ch;
    }

    @Override
    public void write(InternalRow row) throws IOException {
        arrow.write(row);
        pending++;
        if (pending >= ROWS || ((pending & 1023) == 0 && arrow.sizeInBytes() >= BYTES)) {
            flush();
        }
    }

    private void flush() throws IOException {
        if (pending == 0) {
            return;
        }
        arrow.finish();
        file.writeBatch();
        arrow.reset();
        rows += pending;
        pending = 0;
    }

    @Override
    public WriterCommitMessage commit() throws IOException {
        flush();
        file.end();
        file.close();
        done = true;
        Faults.at("write", epoch);
        return new Spool(path, task, rows);
    }

    @Override
    public void abort() {
        done = true;
        try {
            file.close();
        } catch (RuntimeException e) {
            // it goes all the same
        }
        new File(path).delete();
    }

    @Override
    public void close() throws IOException {
        if (!done) {
            abort();
        }
        root.close();
        channel.close();
    }

    /** Where a task's spool goes, and how it is made (shipped to the executors). */
    static final class Factory implements DataWriterFactory, StreamingDataWriterFactory {
        private static final long serialVersionUID = 1L;
        private final StructType schema;
        private final String timeZone;
        private final String prefix;

        Factory(StructType schema, String timeZone, String prefix) {
            this.schema = schema;
            this.timeZone = timeZone;
            this.prefix = prefix;
        }

        @Override
        public DataWriter<InternalRow> createWriter(int partitionId, long taskId) {
            return writer(partitionId, taskId, 0);
        }

        @Override
        public DataWriter<InternalRow> createWriter(int partitionId, long taskId, long epochId) {
            return writer(partitionId, taskId, epochId);
        }

        private DataWriter<InternalRow> writer(int partitionId, long taskId, long epoch) {
            String path = prefix + "." + epoch + "." + partitionId + "." + taskId;
            try {
                return new SpoolWriter(schema, timeZone, path, partitionId, epoch);
            } catch (IOException e) {
                throw new IllegalStateException("the shmq sink cannot write its spool " + path + ": " + e.getMessage(),
                        e);
            }
        }
    }
}
