package io.shmq.spark.sink;

import org.apache.arrow.vector.ValueVector;
import org.apache.arrow.vector.VarBinaryVector;
import org.apache.arrow.vector.VectorSchemaRoot;
import org.apache.spark.sql.catalyst.expressions.SpecializedGetters;
import org.apache.spark.sql.catalyst.expressions.UnsafeRow;
import org.apache.spark.sql.execution.arrow.ArrowFieldWriter;
import org.apache.spark.sql.execution.arrow.ArrowWriter;
import org.apache.spark.sql.execution.arrow.ArrowWriter$;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.Platform;

import java.nio.ByteBuffer;
import java.util.List;

/**
 * A binary column's writer for the spool: the bytes copied into the Arrow vector from the row's own memory where the
 * row is an on-heap {@link UnsafeRow} (what a projection hands a writer), where Spark's own binary writer takes a copy
 * of them first ({@code getBinary}: a new array a row, most of a spool write's time); any other row through
 * {@code getBinary}.
 */
final class RowBinaryWriter extends ArrowFieldWriter {
    private final VarBinaryVector vector;

    private RowBinaryWriter(VarBinaryVector vector) {
        this.vector = vector;
    }

    /** Spark's row-to-Arrow writer for {@code schema}, with this writer for its binary columns. */
    static ArrowWriter create(StructType schema, String timeZone) {
        VectorSchemaRoot root = ArrowWriter.create(schema, timeZone, true, false).root();
        List<org.apache.arrow.vector.FieldVector> vectors = root.getFieldVectors();
        ArrowFieldWriter[] fields = new ArrowFieldWriter[vectors.size()];
        for (int i = 0; i < fields.length; i++) {
            ValueVector v = vectors.get(i);
            fields[i] = v instanceof VarBinaryVector ? new RowBinaryWriter((VarBinaryVector) v)
                    : ArrowWriter$.MODULE$.createFieldWriter(v);
        }
        return new ArrowWriter(root, fields);
    }

    @Override
    public ValueVector valueVector() {
        return vector;
    }

    @Override
    public void setNull() {
        vector.setNull(count());
    }

    @Override
    public void setValue(SpecializedGetters input, int ordinal) {
        if (input instanceof UnsafeRow) {
            UnsafeRow row = (UnsafeRow) input;
            if (row.getBaseObject() instanceof byte[]) {
                long at = row.getLong(ordinal); // (the field's offset in the row, high half, and its size, low half)
                long from = row.getBaseOffset() + (at >>> 32) - Platform.BYTE_ARRAY_OFFSET;
                vector.setSafe(count(), ByteBuffer.wrap((byte[]) row.getBaseObject()), (int) from, (int) at);
                return;
            }
        }
        vector.setSafe(count(), input.getBinary(ordinal));
    }
}
