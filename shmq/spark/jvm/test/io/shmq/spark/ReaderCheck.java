package io.shmq.spark;

import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarBatch;

import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;

/**
 * A task's reader as Spark calls it, over whole streams: args namespace, then the streams to read one after the
 * other (each reader takes the block the one before it gave back). Prints every row as Spark reads it from the
 * batch's columns: "STREAM P OFFSET TIMESTAMP_US KEY VALUE" (bytes in hex, "-" for a null key), then each stream's
 * batches and the blocks kept for the next reader, for the Python test to compare with what it appended.
 */
public final class ReaderCheck {
    private ReaderCheck() {
    }

    public static void main(String[] args) throws Exception {
        HexFormat hex = HexFormat.of();
        for (int k = 1; k < args.length; k++) {
            Target target = new Target(new SourceOptions(Map.of("namespace", args[0], "stream", args[k])));
            List<Plan.Range> ranges = new ArrayList<>();
            try (io.shmq.spark.source.RecordSource s = target.open("the check")) {
                for (int p = 0; p < s.partitions(); p++) {
                    ranges.add(new Plan.Range(p, s.earliest(p), s.latest(p)));
                }
            }
            ColumnarReader reader = new ColumnarReader(target, new ShmqInputPartition(ranges));
            int batches = 0;
            while (reader.next()) {
                ColumnarBatch b = reader.get();
                batches++;
                ColumnVector key = b.column(0), value = b.column(1);
                check(b.column(0).hasNull() == (key.numNulls() > 0), "hasNull() is numNulls() > 0");
                for (int i = 0; i < b.numRows(); i++) {
                    System.out.println(b.column(2).getUTF8String(i) + " " + b.column(3).getInt(i) + " "
                            + b.column(4).getLong(i) + " " + b.column(5).getLong(i) + " "
                            + (key.isNullAt(i) ? "-" : hex.formatHex(key.getBinary(i))) + " "
                            + hex.formatHex(value.getBinary(i)));
                }
            }
            reader.close();
            reader.close();  // Spark may close twice: the block goes back once
            System.out.println("batches " + args[k] + " " + batches + ", blocks kept " + ColumnarReader.spares());
        }
    }

    private static void check(boolean ok, String what) {
        if (!ok) {
            throw new AssertionError(what);
        }
    }
}
