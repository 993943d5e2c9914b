package io.shmq.spark.source;

import static io.shmq.spark.source.SourceCheck.*;

/** RecordBlock: arrays grow to what is asked and never shrink; clear keeps the capacity. */
public final class RecordBlockTest {
    public static void main(String[] args) {
        RecordBlock b = new RecordBlock();
        equal(0, b.count, "a new block's count");
        equal(0, b.offset.length, "a new block's arrays");
        b.ensure(3, 10);
        check(b.offset.length >= 3 && b.data.length >= 10, "ensure(3, 10) gives room for 3 records and 10 bytes");
        int[][] all = {b.keyStart, b.keyLen, b.valueStart, b.valueLen, b.headersStart, b.headersLen};
        for (int[] a : all) {
            equal(b.offset.length, a.length, "every per-record array grows together");
        }
        equal(b.offset.length, b.timestampNs.length, "timestamps grow with offsets");
        b.offset[2] = 42;
        b.data[9] = 7;
        int records = b.offset.length;
        b.ensure(records + 1, 1000);
        check(b.offset.length > records && b.data.length >= 1000, "ensure past the capacity grows");
        equal(42L, b.offset[2], "growing keeps the records");
        equal((byte) 7, b.data[9], "growing keeps the data");
        int big = b.offset.length, bytes = b.data.length;
        b.count = 5;
        b.dataLen = 99;
        b.clear();
        equal(0, b.count, "clear empties");
        equal(0, b.dataLen, "clear empties the arena");
        b.ensure(1, 1);
        equal(big, b.offset.length, "a smaller ensure never shrinks the arrays");
        equal(bytes, b.data.length, "a smaller ensure never shrinks the arena");
        b.ensure(1_000_000, 100_000_000);
        check(b.offset.length >= 1_000_000 && b.data.length >= 100_000_000, "large blocks grow in one call");
        System.out.println("RecordBlockTest OK");
    }
}
