package io.shmq.spark;

import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.types.StructType;

import java.util.Map;

/**
 * The Python data source "shmq_python" (shmq.spark.register), which serves what this connector hands on: the sink,
 * and the sources it does not read in the JVM (a queue, subscribePattern).
 */
final class PythonSource {
    /** The name shmq.spark.register gives the Python data source beside "shmq". */
    static final String NAME = "shmq_python";

    private PythonSource() {
    }

    private static Table table(StructType schema, Transform[] partitioning, Map<String, String> properties,
                               String what) {
        if (!SparkSession.active().sessionState().dataSourceManager().dataSourceExists(NAME)) {
            throw new IllegalStateException("the shmq data source's " + what + " runs in Python: register it in "
                    + "this session with shmq.spark.register(spark) (PySpark, with shmq installed)");
        }
        PythonDataSourceV2 python = new PythonDataSourceV2();
        python.setShortName(NAME);
        return python.getTable(schema, partitioning, properties);
    }

    static SupportsRead reader(StructType schema, Transform[] partitioning, Map<String, String> properties,
                               String why) {
        return (SupportsRead) table(schema, partitioning, properties, "source with " + why);
    }

    static SupportsWrite writer(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        return (SupportsWrite) table(schema, partitioning, properties, "sink");
    }
}
