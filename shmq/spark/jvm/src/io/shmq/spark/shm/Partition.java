package io.shmq.spark.shm;

import io.shmq.spark.source.DataLossException;
import io.shmq.spark.source.RecordBlock;

import java.io.Closeable;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.lang.invoke.MethodHandles;
import java.lang.invoke.VarHandle;
import java.nio.ByteOrder;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.concurrent.atomic.AtomicLong;

import static io.shmq.spark.shm.Layout.*;

/**
 * One stream partition's segment mapped read-only, read without its lock.
 *
 * <p>Strategy (docs/FORMAT.md, "Reading a partition without the lock"): the appender, holding the
 * lock, moves {@code head} over the records it drops before it writes a byte in their place, and
 * publishes new records by one store of {@code tail}, then {@code next_offset}. A reader loads
 * next_offset, tail, head and earliest in that order (acquire), copies records of [head, tail)
 * speculatively, validating every length it follows, then loads head again: when it is still at
 * or below the first position the copy read, nothing it copied was overwritten; else it copies
 * again, or reports the loss when its offsets are below the new earliest.
 *
 * <p>Memory behind the head is given back (punched) only a grace period after the head passed it
 * (shmq/engine/shm/memory.py), so a copy reads given-back memory only when it stalled that long
 * after loading head; the copy then faults on a hole (on a full /dev/shm the JVM's SIGBUS becomes an
 * InternalError), which counts as a copy that was overwritten: the head has moved past it.
 */
public final class Partition implements Closeable {
    private static final VarHandle WORDS = MethodHandles.byteBufferViewVarHandle(long[].class, ByteOrder.LITTLE_ENDIAN);
    /** Copies overwritten this many times in a row: the appender laps the reader, which gives up. */
    static final int MAX_ATTEMPTS = 1000;
    /** Copies made again at once; then the reader sleeps 1 ms between them (a dead appender's state awaits a repair). */
    private static final int SPINS = 100;
    /** A read stops before its block's arena would pass this (a single record always fits: a ring is below 2 GiB). */
    static final long MAX_BLOCK_BYTES = 1L << 30;
    private static final int DAMAGED = -1;
    private static final int GAP = -2;

    private final String what;
    private final MappedByteBuffer buf;
    private final long cap;
    private final int base;
    private final long slots;
    private final AtomicLong retries = new AtomicLong();

    private Partition(String what, MappedByteBuffer buf, long cap, int base, long slots) {
        this.what = what;
        this.buf = buf;
        this.cap = cap;
        this.base = base;
        this.slots = slots;
    }

    /** Maps the segment at {@code path}; FileNotFoundException when it is not there. */
    public static Partition open(Path path, String what) throws IOException {
        MappedByteBuffer buf;
        try (FileChannel ch = FileChannel.open(path, StandardOpenOption.READ)) {
            long size = ch.size();
            if (size > Integer.MAX_VALUE) {
                throw new IOException(what + ": a segment of " + size + " bytes is too large to map (2 GiB at most)");
            }
            if (size < PART_INDEX_OFF) {
                throw new IOException(what + " is not ready (being created?)");
            }
            buf = ch.map(FileChannel.MapMode.READ_ONLY, 0, size);
        } catch (NoSuchFileException e) {
            throw new FileNotFoundException(what + " is not in shared memory on this host (" + path + ")");
        }
        buf.order(ByteOrder.LITTLE_ENDIAN);
        long cap = buf.getLong(PART_CAPACITY_OFF);
        long slots = buf.getLong(PART_SLOTS_OFF);
        long dataOff = buf.getLong(PART_DATA_OFF);
        if (buf.getInt(0) != PART_MAGIC || (buf.getShort(PART_VERSION_OFF) & 0xFFFF) != STREAM_VERSION
                || cap <= 0 || slots <= 0 || dataOff < PART_INDEX_OFF + 8 * slots || dataOff + cap > buf.capacity()) {
            throw new IOException(what + " is not ready, or was made by another shmq version (layout "
                    + (buf.getShort(PART_VERSION_OFF) & 0xFFFF) + ", this reader knows " + STREAM_VERSION + ")");
        }
        return new Partition(what, buf, cap, (int) dataOff, slots);
    }

    private long word(int off) {
        return (long) WORDS.getAcquire(buf, off);
    }

    private void checkLive() throws IOException {
        if (deleted()) {
            throw new IOException(what + ": the stream was deleted");
        }
    }

    /** The stream was deleted (a stream of the same name made since has segments of its own). */
    public boolean deleted() {
        return word(PART_DELETED) != 0;
    }

    /** The oldest offset in shared memory. */
    public long memoryEarliest() throws IOException {
        checkLive();
        return word(PART_EARLIEST);
    }

    /** The oldest readable offset: in shared memory or, for a "wal" stream, in its logs on disk. */
    public long earliest() throws IOException {
        checkLive();
        long earliest = word(PART_EARLIEST);
        long disk = word(PART_DISK_FIRST);
        return disk != 0 ? Math.min(earliest, disk - 1) : earliest;
    }

    /** The last stable offset: the offset the next append gets, unless a transaction is open (its first offset). */
    public long latest() throws IOException {
        checkLive();
        long stable = word(PART_STABLE);
        long next = word(PART_NEXT);
        return stable != 0 ? Math.min(stable - 1, next) : next;
    }

    /** Copies that found their records overwritten and were made again. */
    public long retries() {
        return retries.get();
    }

    /**
     * RecordSource.read's records of this partition (docs/FORMAT.md: the reader's steps). Thread-safe: readers share
     * one mapping, and each read keeps its state on its own stack and in its own {@code out}.
     */
    public int read(long from, long until, int maxRecords, RecordBlock out) throws IOException {
        try {
            return copy(from, until, maxRecords, out);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new java.io.InterruptedIOException(what + ": interrupted while reading");
        }
    }

    private int copy(long from, long until, int maxRecords, RecordBlock out) throws IOException, InterruptedException {
        out.clear();
        out.next = from;
        if (from < 0 || until < from || maxRecords < 0) {
            throw new IllegalArgumentException(what + ": cannot read offsets [" + from + ", " + until + ") x "
                    + maxRecords);
        }
        if (until == from || maxRecords == 0) {
            return 0;
        }
        Gap gap = new Gap();
        for (int attempt = 1; ; attempt++) {
            checkLive();
            long next = word(PART_NEXT);
            long stable = word(PART_STABLE);
            long tail = word(PART_TAIL);
            long head = word(PART_HEAD);
            long earliest = word(PART_EARLIEST);
            long clean = word(PART_CLEANED) - 1; // -1: never compacted; a gap up to it is compaction's
            long compactLow = word(PART_COMPACT_LOW);
            long at = from;
            if (at < earliest && compactLow != 0 && at >= compactLow - 1 && word(PART_DISK_FIRST) == 0) {
                at = earliest; // compaction took every record from there to earliest: read on at earliest
            }
            if (at < earliest) {
                throw below(from, earliest);
            }
            if (from >= next) {
                if (from == next) {
                    return 0;
                }
                throw new IOException(what + ": offset " + from + " is past the end (" + next + ")");
            }
            // records at or past the loaded next_offset may lie below tail already (stored first): not yet
            long stop = Math.min(until, stable != 0 ? Math.min(stable - 1, next) : next);
            if (from >= stop) {
                return 0;
            }
            int n = DAMAGED;
            long start = head;
            if (head < tail) { // else an append is starting a new lap: look again
                try {
                    start = locate(at, head, tail, earliest);
                    n = walk(start, head, tail, next, at, stop, maxRecords, out, gap, clean);
                } catch (InternalError e) { // a given-back region faulted (memory: a stalled copy): copy again
                    n = DAMAGED;
                    start = Long.MIN_VALUE;
                }
            }
            VarHandle.acquireFence(); // the copy's loads before the check's
            if (head < tail && word(PART_HEAD) <= start) {
                if (n == GAP) {
                    out.clear();
                    if (gap.atHead) { // retention dropped from, and earliest was not yet moved when it was read
                        throw below(from, gap.end);
                    }
                    throw new DataLossException(what + ": offsets " + from + ".." + (gap.end - 1) + " were lost"
                            + " (a reboot, or a damaged or deleted log file); read on from " + gap.end, gap.end);
                }
                if (n == DAMAGED) {
                    out.clear();
                    throw new IOException(what + ": a damaged record at or after offset " + from);
                }
                return n;
            }
            retries.incrementAndGet();
            out.clear();
            if (attempt >= MAX_ATTEMPTS) {
                throw new IOException(what + ": the records from offset " + from + " changed under " + attempt
                        + " copies in a row (appends lapping the reader, or an appender that died in an append)");
            }
            if (attempt > SPINS) {
                Thread.sleep(1);
            } else {
                Thread.onSpinWait();
            }
        }
    }

    private IOException below(long from, long earliest) {
        long disk = word(PART_DISK_FIRST);
        if (disk != 0 && from >= disk - 1) {
            return new OnDiskException(what + ": offset " + from + " is only in the logs on disk (shared memory holds "
                    + earliest + " on)", earliest);
        }
        return new DataLossException(what + ": offsets " + from + ".." + (earliest - 1)
                + " were dropped by retention; the earliest is " + earliest, earliest);
    }

    /** The position of the index's record at or before {@code from} (its stride's first), when it holds, else head. */
    private long locate(long from, long head, long tail, long earliest) {
        long anchor = from - from % INDEX_STRIDE;
        if (anchor >= earliest) {
            long pos = buf.getLong(PART_INDEX_OFF + 8 * (int) ((anchor / INDEX_STRIDE) % slots));
            if (head <= pos && pos < tail && (pos & 7) == 0 && pos % cap <= cap - REC_SIZE) {
                long off = buf.getLong(at(pos) + REC_MSG_ID); // its anchor's, or after a compaction the first after it
                if (anchor <= off && off <= from) {
                    return pos;
                }
            }
        }
        return head;
    }

    private int at(long pos) {
        return base + (int) (pos % cap);
    }

    /**
     * Copies the records of offsets [from, until) found from {@code pos} before {@code tail}, at most
     * {@code max}, stopping at a gap in the offsets (but a compaction's, up to {@code clean}); their count,
     * GAP ({@code gap} says where the offsets go on) or DAMAGED. Speculative: the caller checks afterwards
     * that nothing was overwritten.
     */
    private int walk(long pos, long head, long tail, long next, long from, long until, int max, RecordBlock out,
                     Gap gap, long clean) {
        int n = 0;
        int looked = 0; // records looked at: those copied, and markers and aborted records passed over
        long prev = -1;
        boolean first = pos == head;
        while (pos < tail) {
            long rem = cap - pos % cap;
            if (rem < REC_SIZE) { // too little of the lap left for a record: the next lap
                pos += rem;
                continue;
            }
            int a = at(pos);
            long length = buf.getInt(a + REC_LENGTH) & 0xFFFFFFFFL;
            if (length < REC_SIZE || (length & 7) != 0 || length > rem || pos + length > tail) {
                return DAMAGED;
            }
            pos += length;
            if ((buf.get(a + REC_STATUS) & 0xFF) == PAD) {
                continue;
            }
            long off = buf.getLong(a + REC_MSG_ID);
            if (off < from) {
                first = false;
                continue;
            }
            if (looked == 0 && off != from && off > clean) {
                gap.end = off;
                gap.atHead = first;
                return GAP;
            }
            if ((looked > 0 && off != prev + 1 && off > clean) || off >= until) {
                break; // a gap after the first record: the next read is told of it
            }
            if ((buf.getInt(a + REC_FLAGS) & (FLAG_CONTROL | FLAG_ABORTED)) != 0) {
                prev = off; // a transaction's marker, an aborted transaction's record: passed over
                out.next = off + 1;
                if (++looked >= max) {
                    break;
                }
                continue;
            }
            long hl = buf.getInt(a + REC_HDR_LEN) & 0xFFFFFFFFL;
            long bl = buf.getInt(a + REC_BODY_LEN) & 0xFFFFFFFFL;
            long klen = buf.getLong(a + REC_KEY);
            if (REC_SIZE + hl + bl > length || klen < 0 || klen > hl + 1) {
                return DAMAGED;
            }
            int d = out.dataLen;
            int payload = (int) (hl + bl);
            if (n > 0 && d + (long) payload > MAX_BLOCK_BYTES) {
                break; // the block's arena is an array: the next read goes on from here
            }
            out.ensure(n + 1, d + payload);
            buf.get(a + REC_SIZE, out.data, d, payload);
            out.offset[n] = off;
            out.timestampNs[n] = buf.getLong(a + REC_ENQ_NS);
            int k = klen == 0 ? 0 : (int) klen - 1;
            out.keyStart[n] = d;
            out.keyLen[n] = klen == 0 ? -1 : k;
            out.headersStart[n] = d + k;
            out.headersLen[n] = (int) hl - k;
            out.valueStart[n] = d + (int) hl;
            out.valueLen[n] = (buf.getInt(a + REC_FLAGS) & FLAG_NULL_VALUE) != 0 ? -1 : (int) bl; // -1: a tombstone
            out.dataLen = d + payload;
            out.count = ++n;
            out.next = off + 1;
            prev = off;
            if (++looked >= max) {
                break;
            }
        }
        if (looked == 0) { // nothing at or after from below the tail: offsets up to the end were lost
            if (next <= clean) { // or compacted away
                out.next = next;
                return 0;
            }
            gap.end = next;
            gap.atHead = false;
            return GAP;
        }
        return n;
    }

    /** Where a walk's GAP ends, and whether it was found on the first record at head (dropped by retention). */
    private static final class Gap {
        long end;
        boolean atHead;
    }

    /** Nothing to release: the mapping goes with the buffer. */
    @Override
    public void close() {
    }
}
