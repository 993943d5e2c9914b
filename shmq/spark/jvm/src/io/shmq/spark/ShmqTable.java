package io.shmq.spark;

import io.shmq.spark.source.ShmStream;

import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.util.EnumSet;
import java.util.Map;
import java.util.Set;

/**
 * A shmq stream as a Spark table: read here (batch and micro-batch), written here (the JVM sink,
 * {@link io.shmq.spark.sink.SinkWrite}), and a queue source or subscribePattern read through the Python source
 * ({@link PythonSource}), saying so in the log.
 */
final class ShmqTable implements SupportsRead, SupportsWrite {
    private static final Logger LOG = LoggerFactory.getLogger("shmq.spark");
    private final StructType schema;
    private final Transform[] partitioning;
    private final Map<String, String> properties;

    ShmqTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        this.schema = schema;
        this.partitioning = partitioning;
        this.properties = properties;
    }

    @Override
    public String name() {
        return "shmq";
    }

    @Override
    @SuppressWarnings("deprecation")
    public StructType schema() {
        return schema;
    }

    @Override
    public Transform[] partitioning() {
        return partitioning;
    }

    @Override
    public Map<String, String> properties() {
        return properties;
    }

    @Override
    public Set<TableCapability> capabilities() {
        return EnumSet.of(TableCapability.BATCH_READ, TableCapability.MICRO_BATCH_READ, TableCapability.BATCH_WRITE,
                TableCapability.STREAMING_WRITE, TableCapability.TRUNCATE);
    }

    @Override
    public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
        SourceOptions opts = new SourceOptions(options);
        String why = opts.pythonOnly();
        if (why == null) {
            why = logged(opts);
        }
        if (why != null) {
            LOG.info("shmq source: read by the Python source ({})", why);
            return PythonSource.reader(schema, partitioning, properties, why).newScanBuilder(options);
        }
        return new ShmqScan(opts);
    }

    /**
     * Why a stream of this host goes to the Python source: a "wal" stream's older records may be only in its logs on
     * disk, which {@link ShmStream} does not read (over TCP the server reads them). Null otherwise, or when the stream
     * is not here: the scan says why.
     */
    private static String logged(SourceOptions opts) {
        if (opts.url != null) {
            return null;
        }
        try (ShmStream s = ShmStream.open(opts.namespace(), opts.stream)) {
            return s.logged() ? "a \"wal\" stream: its older records may be only in its logs on disk" : null;
        } catch (IOException | RuntimeException e) {
            return null;
        }
    }

    /** The sink in the JVM ({@link io.shmq.spark.sink.SinkWrite}); the Python sink with spark.shmq.jvmSink=false. */
    @Override
    public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
        String jvm = org.apache.spark.sql.classic.SparkSession.active().conf().get("spark.shmq.jvmSink", "true");
        if (jvm.equalsIgnoreCase("false")) {
            LOG.info("shmq sink: written by the Python sink (spark.shmq.jvmSink=false)");
            return PythonSource.writer(schema, partitioning, properties).newWriteBuilder(info);
        }
        return new io.shmq.spark.sink.SinkWrite(info);
    }
}
