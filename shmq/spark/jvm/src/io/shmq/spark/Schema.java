package io.shmq.spark;

import org.apache.spark.sql.types.StructType;

/** The source's columns: shmq/spark/schema.py's, in the same DDL (Kafka's source's, with stream for topic). */
final class Schema {
    static final String FIELDS = "key binary, value binary, stream string, partition int, offset long, "
            + "timestamp timestamp";

    private Schema() {
    }

    /** The source's columns; with includeHeaders, headers map&lt;string,string&gt; too. */
    static StructType of(boolean includeHeaders) {
        return StructType.fromDDL(FIELDS + (includeHeaders ? ", headers map<string,string>" : ""));
    }
}
