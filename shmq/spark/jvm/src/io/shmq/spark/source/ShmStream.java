package io.shmq.spark.source;

import io.shmq.spark.shm.Layout;
import io.shmq.spark.shm.Partition;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.channels.FileChannel;
import java.nio.file.NoSuchFileException;
import java.nio.file.Path;
import java.nio.file.Paths;
import java.nio.file.StandardOpenOption;
import java.util.regex.Pattern;

/**
 * A stream read straight from its /dev/shm segments, mapped read-only, without the lock
 * (docs/FORMAT.md, "Reading a partition without the lock"). Offsets only in a "wal" stream's logs
 * on disk throw {@link io.shmq.spark.shm.OnDiskException}: read those another way.
 */
public final class ShmStream implements RecordSource {
    private static final Pattern NAMESPACE = Pattern.compile("[A-Za-z0-9_-]{1,40}");
    private static final Pattern NAME = Pattern.compile("[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}");
    private static final Path SHM_DIR = Paths.get("/dev/shm");

    private final String name;
    private final Partition[] parts;
    private final boolean logged;

    private ShmStream(String name, Partition[] parts, boolean logged) {
        this.name = name;
        this.parts = parts;
        this.logged = logged;
    }

    /** Maps the stream's partition segments read-only; FileNotFoundException when they are not on this host. */
    public static ShmStream open(String namespace, String stream) throws IOException {
        if (namespace == null || !NAMESPACE.matcher(namespace).matches()) {
            throw new IllegalArgumentException("invalid namespace " + namespace + ": use 1-40 of A-Z a-z 0-9 _ -");
        }
        if (stream == null || !NAME.matcher(stream).matches()) {
            throw new IllegalArgumentException("invalid stream name " + stream
                    + ": use 1-128 of A-Z a-z 0-9 _ . : - (not starting with . : -)");
        }
        String base = "shmq." + namespace + ".s." + stream;
        String what = "stream '" + stream + "' in namespace '" + namespace + "'";
        ByteBuffer head = staticHeader(SHM_DIR.resolve(base), what);
        int n = head.getShort(Layout.STREAM_PARTITIONS_OFF) & 0xFFFF;
        Partition[] parts = new Partition[n];
        for (int p = 0; p < n; p++) {
            parts[p] = Partition.open(SHM_DIR.resolve(base + "#" + p), "stream '" + stream + "' partition " + p);
        }
        return new ShmStream(stream, parts, head.get(Layout.STREAM_DURABILITY_OFF) == Layout.DURABILITY_WAL);
    }

    /** The meta segment's static header, checked (magic, layout version). */
    private static ByteBuffer staticHeader(Path meta, String what) throws IOException {
        ByteBuffer head = ByteBuffer.allocate(Layout.STREAM_STATIC_SIZE).order(ByteOrder.LITTLE_ENDIAN);
        try (FileChannel ch = FileChannel.open(meta, StandardOpenOption.READ)) {
            while (head.hasRemaining() && ch.read(head, head.position()) > 0) {
                // read the static header whole
            }
        } catch (NoSuchFileException e) {
            throw new FileNotFoundException("no " + what + " in shared memory on this host (" + meta + ")");
        }
        int version = head.getShort(4) & 0xFFFF;
        if (head.hasRemaining() || head.getInt(0) != Layout.STREAM_MAGIC) {
            throw new IOException(what + " is not ready (being created?)");
        }
        if (version != Layout.STREAM_VERSION) {
            throw new IOException(what + " was made by another shmq version (layout " + version + ", this reader knows "
                    + Layout.STREAM_VERSION + ")");
        }
        return head;
    }

    /** A "wal" stream: its older records may be only in the logs on disk, which this reader does not read. */
    public boolean logged() {
        return logged;
    }

    /** The stream's name. */
    public String name() {
        return name;
    }

    private Partition part(int partition) {
        if (partition < 0 || partition >= parts.length) {
            throw new IllegalArgumentException("stream '" + name + "' has partitions 0.." + (parts.length - 1)
                    + ", not " + partition);
        }
        return parts[partition];
    }

    @Override
    public int partitions() {
        return parts.length;
    }

    /** The oldest readable offset, as the Python source says: for a "wal" stream, possibly on disk only. */
    @Override
    public long earliest(int partition) throws IOException {
        return part(partition).earliest();
    }

    /** The oldest offset shared memory holds: from there on, {@link #read} reads. */
    public long memoryEarliest(int partition) throws IOException {
        return part(partition).memoryEarliest();
    }

    @Override
    public long latest(int partition) throws IOException {
        return part(partition).latest();
    }

    @Override
    public int read(int partition, long from, long until, int maxRecords, RecordBlock out) throws IOException {
        return part(partition).read(from, until, maxRecords, out);
    }

    /** Copies, over all partitions, that found their records overwritten by appends and were made again. */
    public long retries() {
        long n = 0;
        for (Partition p : parts) {
            n += p.retries();
        }
        return n;
    }

    /** The mappings go when this object is collected; nothing else is held. */
    @Override
    public void close() {
    }
}
