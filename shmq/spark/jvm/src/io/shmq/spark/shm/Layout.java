/* GENERATED from shmq/engine/shm/layout.py: do not edit. Regenerate with
 * python -c 'from shmq.engine.shm import layout; layout.write_java_layout()' */
package io.shmq.spark.shm;

/**
 * The byte layout of a stream's segments, as shmq/engine/shm/layout.py defines it (the one source:
 * layout.write_java_layout() writes this file, tests/spark/test_jvm_unit.py fails while it is stale).
 * Offsets are in bytes.
 */
public final class Layout {
    private Layout() {
    }

    /** The stream's meta segment: magic, version, partitions (u16 at 6; it grows on a live stream: read at open). */
    public static final int STREAM_MAGIC = 0x534d4853; // b"SHMS" read little-endian
    public static final int STREAM_VERSION = 7;
    public static final int STREAM_PARTITIONS_OFF = 6;
    /** Its durability (u8 at 9): DURABILITY_WAL keeps records in logs on disk past what shared memory holds. */
    public static final int STREAM_DURABILITY_OFF = 9;
    public static final int DURABILITY_WAL = 2;
    public static final int STREAM_STATIC_SIZE = 64;

    /** A partition segment's static header: magic, version, pad, capacity, max message, index slots, data offset. */
    public static final int PART_MAGIC = 0x504d4853; // b"SHMP" read little-endian
    public static final int PART_VERSION_OFF = 4;
    public static final int PART_CAPACITY_OFF = 8;
    public static final int PART_SLOTS_OFF = 24;
    public static final int PART_DATA_OFF = 32;
    public static final int PART_STATIC_SIZE = 48;

    /** The partition's control words. */
    public static final int PART_DELETED = 128;
    public static final int PART_HEAD = 136;
    public static final int PART_TAIL = 144;
    public static final int PART_EARLIEST = 152;
    public static final int PART_NEXT = 160;
    public static final int PART_DISK_FIRST = 208;
    /** 0 while no transaction is open in the partition, else 1 + the last stable offset: readers read below it. */
    public static final int PART_STABLE = 472;
    /** A compacted partition: 1 + the offset compaction has run up to (a gap below it is compaction's, not a loss). */
    public static final int PART_CLEANED = 480;
    /** 1 + the earliest offset before the compactions since retention last dropped: below earliest from it, read on at earliest. */
    public static final int PART_COMPACT_LOW = 488;
    /** The sparse offset index: the position of every INDEX_STRIDE-th offset, slot = offset / stride % slots. */
    public static final int PART_INDEX_OFF = 10752;
    public static final int INDEX_STRIDE = 16;

    /** A record's 48-byte header. */
    public static final int REC_SIZE = 48;
    public static final int REC_STATUS = 0;
    public static final int REC_LENGTH = 8;
    public static final int REC_BODY_LEN = 12;
    public static final int REC_HDR_LEN = 16;
    public static final int REC_FLAGS = 20;
    public static final int REC_MSG_ID = 24;
    public static final int REC_ENQ_NS = 32;
    /** In a stream record: the key's length + 1, 0 for no key; the key precedes the headers. */
    public static final int REC_KEY = 40;
    /** In a stream record's flags: its value is null (a tombstone, its value bytes none). */
    public static final int FLAG_NULL_VALUE = 0x1;
    /** In a stream record's flags: a transaction's marker, and a record of a transaction that aborted (readers pass over both). */
    public static final int FLAG_CONTROL = 0x2;
    public static final int FLAG_ABORTED = 0x4;
    /** Status (low byte) of a filler record to the end of the lap. */
    public static final int PAD = 4;
}
