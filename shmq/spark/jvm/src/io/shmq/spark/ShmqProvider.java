package io.shmq.spark;

import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

import java.util.Map;

/**
 * format("shmq") in the JVM (docs/SPARK.md, "The JVM source"). Spark looks a short name up among the
 * DataSourceRegister services on its classpath before it looks among Python data sources, so with this jar on the
 * classpath "shmq" is this provider; without it, shmq.spark.register's Python data source. The Python source
 * stays reachable as "shmq_python", and serves what this one hands on (the sink, a queue source).
 */
public final class ShmqProvider implements TableProvider, DataSourceRegister {
    @Override
    public String shortName() {
        return "shmq";
    }

    /** The source's columns, checked options first: no Python process is started to learn them. */
    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        SourceOptions opts = new SourceOptions(options);
        return Schema.of(opts.flag("includeHeaders", false));
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        return new ShmqTable(schema, partitioning, properties);
    }

    /** A sink is given the query's schema (as the Python data source is). */
    @Override
    public boolean supportsExternalMetadata() {
        return true;
    }
}
