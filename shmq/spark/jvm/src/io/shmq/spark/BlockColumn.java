package io.shmq.spark;

import io.shmq.spark.source.RecordBlock;

import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.sql.vectorized.ColumnVector;
import org.apache.spark.sql.vectorized.ColumnarArray;
import org.apache.spark.sql.vectorized.ColumnarMap;
import org.apache.spark.unsafe.types.UTF8String;

import java.util.Arrays;

/**
 * A column of a {@link RecordBlock} as Spark's read-only {@link ColumnVector}: Spark reads the block's own arrays,
 * so a record is copied once, from shared memory (or the socket) into the block, and not again into a vector.
 *
 * <p>Strategy: the block is the reader's, refilled by each read; a batch made of these columns is valid until the
 * reader's next {@code next()} or {@code close()}, as Spark's own vectorized readers' batches are.
 */
abstract class BlockColumn extends ColumnVector {
    final RecordBlock block;

    private BlockColumn(DataType type, RecordBlock block) {
        super(type);
        this.block = block;
    }

    /** The record's key (binary; null when it has none). */
    static BlockColumn key(RecordBlock block) {
        return new Bytes(block, true);
    }

    /** The record's value (binary). */
    static BlockColumn value(RecordBlock block) {
        return new Bytes(block, false);
    }

    /** The record's offset (long). */
    static BlockColumn offset(RecordBlock block) {
        return new Longs(block, DataTypes.LongType);
    }

    /** The record's append time (timestamp: microseconds since the epoch, UTC). */
    static BlockColumn timestamp(RecordBlock block) {
        return new Longs(block, DataTypes.TimestampType);
    }

    @Override
    public void close() {
        // the block belongs to the reader
    }

    @Override
    public boolean hasNull() {
        return numNulls() > 0;
    }

    @Override
    public int numNulls() {
        return 0;
    }

    @Override
    public boolean isNullAt(int rowId) {
        return false;
    }

    private UnsupportedOperationException unsupported(String what) {
        return new UnsupportedOperationException("a shmq " + dataType().simpleString() + " column has no " + what);
    }

    @Override
    public boolean getBoolean(int rowId) {
        throw unsupported("booleans");
    }

    @Override
    public byte getByte(int rowId) {
        throw unsupported("bytes");
    }

    @Override
    public short getShort(int rowId) {
        throw unsupported("shorts");
    }

    @Override
    public int getInt(int rowId) {
        throw unsupported("ints");
    }

    @Override
    public long getLong(int rowId) {
        throw unsupported("longs");
    }

    @Override
    public float getFloat(int rowId) {
        throw unsupported("floats");
    }

    @Override
    public double getDouble(int rowId) {
        throw unsupported("doubles");
    }

    @Override
    public ColumnarArray getArray(int rowId) {
        throw unsupported("arrays");
    }

    @Override
    public ColumnarMap getMap(int ordinal) {
        throw unsupported("maps");
    }

    @Override
    public Decimal getDecimal(int rowId, int precision, int scale) {
        throw unsupported("decimals");
    }

    @Override
    public UTF8String getUTF8String(int rowId) {
        throw unsupported("strings");
    }

    @Override
    public byte[] getBinary(int rowId) {
        throw unsupported("binaries");
    }

    @Override
    public ColumnVector getChild(int ordinal) {
        throw unsupported("children");
    }

    /** Keys or values: slices of the block's arena; a length below 0 is null. */
    private static final class Bytes extends BlockColumn {
        private final boolean key;

        Bytes(RecordBlock block, boolean key) {
            super(DataTypes.BinaryType, block);
            this.key = key;
        }

        private int[] lengths() {
            return key ? block.keyLen : block.valueLen;
        }

        @Override
        public int numNulls() {
            int[] len = lengths();
            int n = 0;
            for (int i = 0; i < block.count; i++) {
                if (len[i] < 0) {
                    n++;
                }
            }
            return n;
        }

        @Override
        public boolean isNullAt(int rowId) {
            return lengths()[rowId] < 0;
        }

        @Override
        public byte[] getBinary(int rowId) {
            int len = lengths()[rowId];
            if (len < 0) {
                return null;
            }
            int start = (key ? block.keyStart : block.valueStart)[rowId];
            return Arrays.copyOfRange(block.data, start, start + len);
        }
    }

    /** Offsets as they are, or timestamps in microseconds (the block holds nanoseconds). */
    private static final class Longs extends BlockColumn {
        private final boolean micros;

        Longs(RecordBlock block, DataType type) {
            super(type, block);
            this.micros = type == DataTypes.TimestampType;
        }

        @Override
        public long getLong(int rowId) {
            return micros ? Math.floorDiv(block.timestampNs[rowId], 1000L) : block.offset[rowId];
        }
    }
}
