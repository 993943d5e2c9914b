package io.shmq.spark;

import org.apache.spark.sql.types.StructType;

/** The source's columns: shmq/spark/schema.py's, in the same DDL (Kafka's source's, with stream for topic). */
final class Schema {
    static final String FIELDS = "key binary, value binary, stream string, partition int, offset long, "
            + "timestamp timestamp";

    /** Parsed once, not for every task and plan (the parse is ANTLR's): a StructType is immutable. */
    private static final StructType PLAIN = StructType.fromDDL(FIELDS);
    private static final StructType WITH_HEADERS = StructType.fromDDL(FIELDS + ", headers map<string,string>");

    private Schema() {
    }

    /** The source's columns; with includeHeaders, headers map&lt;string,string&gt; too. */
    static StructType of(boolean includeHeaders) {
        return includeHeaders ? WITH_HEADERS : PLAIN;
    }
}
